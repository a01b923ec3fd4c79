#pragma once
// A random llama2.c model small enough for the tests to build many fresh references: grouped-query
// attention (6 query heads over 2 key/value heads), random weights (llama2::random_weights).

#include "llama2/checkpoint.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace specdec_test {

/// The shape of a tiny_llama model (llama2::config's fields).
struct tiny_shape {
    std::int32_t dim = 60;
    std::int32_t hidden_dim = 100;
    std::int32_t n_layers = 3;
    std::int32_t vocab_size = 300;
    std::int32_t seq_len = 96;
};

/// A model of `shape` with weights drawn from `seed`, named `name`.
inline std::shared_ptr<const llama2::checkpoint> tiny_llama(std::uint64_t seed, std::string name, tiny_shape shape = {}) {
    auto ck = std::make_shared<llama2::checkpoint>();
    ck->name = std::move(name);
    llama2::config& c = ck->cfg;
    c.dim = shape.dim;
    c.hidden_dim = shape.hidden_dim;
    c.n_layers = shape.n_layers;
    c.n_heads = 6;
    c.n_kv_heads = 2;  // grouped-query attention
    c.vocab_size = shape.vocab_size;
    c.seq_len = shape.seq_len;
    ck->w = llama2::random_weights(c, seed);
    return ck;
}

}  // namespace specdec_test
