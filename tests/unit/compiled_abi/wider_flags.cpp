// compiled_mode.wider_flags_do_not_link: a program in compiled mode whose own translation unit is
// compiled with wider instruction-set flags (-mavx2 -mfma) than the library's source file. Eigen
// then allocates and frees its heap memory differently in the two (EIGEN_DEFAULT_ALIGN_BYTES 32
// against 16), and the library's workspaces are freed here: the program must not link, and the
// linker's error must name the mismatch (the entry points' inline namespace, see
// SPECDEC_DETAIL_CORE_BEGIN in detail/isa_config.hpp). tests/CMakeLists.txt compiles and links
// it; compiled with the library's own flags (the control) it links and runs.
#include <specdec/speculative_decode.hpp>

#include <random>

struct model {
    int vocab_size() const { return 4; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) { return Eigen::VectorXf::Zero(4); }
};

int main() {
    model draft, target;
    std::mt19937_64 rng(1);
    const auto out = specdec::speculative_decode(draft, target, {1, 2}, {.budget = {.max_new_tokens = 8}}, rng);
    return out.tokens.size() == 8 ? 0 : 1;
}
