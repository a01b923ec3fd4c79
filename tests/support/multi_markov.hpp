#pragma once
// Test doubles of the multi-sequence concepts over the small Markov models of markov.hpp: a
// MultiSequenceVerifier that scores every request of a pass, and a MultiSequenceDrafter that
// drafts position by position across all sequences (as an engine with one draft forward per
// position does), each sequence from its own uniforms.

#include "markov.hpp"

#include <specdec/multi_sequence.hpp>
#include <specdec/sampling.hpp>

#include <Eigen/Core>

#include <cstddef>
#include <set>
#include <span>
#include <stdexcept>
#include <vector>

namespace specdec_test {

/// A MultiSequenceVerifier over a markov_model, counting passes and the requests they held.
struct multi_markov_verifier {
    const markov_model* model;
    std::size_t passes = 0;
    std::size_t requests = 0;
    bool fail = false;  // throw from the next pass
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void score_batch(std::span<const specdec::score_request> batch, specdec::packed_logits& out) {
        if (fail) throw std::runtime_error("multi-sequence pass failed");
        std::set<std::size_t> slots;
        for (const auto& r : batch)
            if (!slots.insert(r.slot).second) throw std::logic_error("slot used twice in one pass");
        if (out.size() != batch.size()) throw std::logic_error("packed_logits not shaped for the batch");
        ++passes;
        requests += batch.size();
        std::vector<token_id> seq;
        for (std::size_t i = 0; i < batch.size(); ++i) {
            seq.assign(batch[i].context.begin(), batch[i].context.end());
            auto cols = out.sequence(i);
            for (std::size_t j = 0; j <= batch[i].draft.size(); ++j) {
                const std::size_t row = model->row_of(seq) * static_cast<std::size_t>(model->vocab);
                cols.col(static_cast<Eigen::Index>(j)) = Eigen::Map<const Eigen::VectorXf>(model->table.data() + row, model->vocab);
                if (j < batch[i].draft.size()) seq.push_back(batch[i].draft[j]);
            }
        }
    }
};

/// A MultiSequenceDrafter over a markov_model: position-major (position 0 of every sequence,
/// then position 1, ...), each sequence's token sampled from its standardized draft row with
/// its own uniforms, so each block equals a one-sequence model drafter's.
struct multi_markov_drafter {
    const markov_model* model;
    std::size_t calls = 0;
    std::vector<std::vector<token_id>> seqs{};
    Eigen::VectorXf logits{};
    specdec::sampling_workspace sws{};
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft_batch(std::span<specdec::draft_request> batch, const specdec::sampling_config& sampling) {
        ++calls;
        const auto V = static_cast<Eigen::Index>(model->vocab);
        seqs.resize(batch.size());
        std::size_t longest = 0;
        std::vector<bool> open(batch.size(), true);
        for (std::size_t i = 0; i < batch.size(); ++i) {
            seqs[i].assign(batch[i].context.begin(), batch[i].context.end());
            batch[i].out->resize_probs(V, static_cast<Eigen::Index>(batch[i].gamma));
            longest = std::max(longest, batch[i].gamma);
        }
        for (std::size_t pos = 0; pos < longest; ++pos) {
            for (std::size_t i = 0; i < batch.size(); ++i) {
                auto& r = batch[i];
                if (!open[i] || pos >= r.gamma) continue;
                const std::size_t row = model->row_of(seqs[i]) * static_cast<std::size_t>(model->vocab);
                logits = Eigen::Map<const Eigen::VectorXf>(model->table.data() + row, V);
                auto q = r.out->probs.col(static_cast<Eigen::Index>(pos));
                const auto d = specdec::standardize_weights_and_sample(logits, sampling, q, r.uniforms(), sws);
                r.out->scales.push_back(d.scale);
                r.out->tokens.push_back(d.token);
                r.out->model_calls = r.out->model_calls.value_or(0) + 1;
                seqs[i].push_back(d.token);
                if (static_cast<double>(d.scale) * static_cast<double>(q[d.token]) < static_cast<double>(r.out->stop_below))
                    open[i] = false;
            }
        }
        for (auto& r : batch) r.out->standardized = true;
    }
};

}  // namespace specdec_test
