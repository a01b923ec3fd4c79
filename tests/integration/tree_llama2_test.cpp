// The llama2 example engine's score_tree (tree attention): every column equals next_logits on
// the node's path, bit for bit, on a small random model (no model files needed); after the
// accepted path is appended, the cache reuses the path's rows and the next calls still agree;
// tree decoding with the engine at temperature 0 is greedy decoding (also with the draft's own
// sampling and the draft-side stop, and with the adaptive depth).

#include "support/catch.hpp"
#include "support/tree_reference.hpp"
#include "support/tiny_llama.hpp"

#include "llama2/checkpoint.hpp"
#include "llama2/transformer.hpp"

#include <specdec/specdec.hpp>

#include <memory>
#include <random>
#include <vector>

static_assert(specdec::TreeVerifier<llama2::transformer>);

namespace {

std::shared_ptr<const llama2::checkpoint> tiny_model(std::uint64_t seed) {
    return specdec_test::tiny_llama(seed, "random-tree");
}

}  // namespace

TEST_CASE("llama2 score_tree: each column equals next_logits on the node's path, bit for bit", "[tree][llama2]") {
    const auto model = tiny_model(42);
    llama2::transformer scorer(model), stepper(model);
    std::mt19937_64 rng(9);
    specdec::uniform_source uniforms(rng);
    specdec::draft_tree tree;
    std::vector<specdec::token_id> path, context{1, 17, 250, 3};
    Eigen::VectorXf logits, q, scratch;
    specdec::sampling_workspace sws;
    Eigen::MatrixXf out;
    llama2::transformer drafter(model, 1);  // the first block only: a cheap, different draft
    for (int round = 0; round < 12; ++round) {
        const std::vector<std::size_t> shape = round % 3 == 0 ? std::vector<std::size_t>{3, 2, 1, 1}
                                               : round % 3 == 1 ? std::vector<std::size_t>{2, 2}
                                                                : std::vector<std::size_t>{1, 1, 1};
        specdec::draft_tree_from_model(drafter, context, {.branching = shape}, {.temperature = 1.5f}, uniforms, tree,
                                       path, logits, q, scratch, sws);
        scorer.score_tree(context, tree, out);
        REQUIRE(out.rows() == 300);
        REQUIRE(out.cols() == static_cast<Eigen::Index>(tree.size() + 1));
        for (std::size_t c = 0; c <= tree.size(); ++c) {
            specdec::path_tokens(tree, static_cast<std::int32_t>(c) - 1, path);
            path.insert(path.begin(), context.begin(), context.end());
            const Eigen::VectorXf want = stepper.next_logits(path);
            INFO("round " << round << ", column " << c);
            CHECK((out.col(static_cast<Eigen::Index>(c)).array() == want.array()).all());
        }
        // Accept a random path (up to a random node) and one more token, as decoding does; the
        // next round's context extends the scored one, so the scorer reuses the path's rows.
        const auto last = static_cast<std::int32_t>(rng() % (tree.size() + 1)) - 1;
        specdec::path_tokens(tree, last, path);
        context.insert(context.end(), path.begin(), path.end());
        context.push_back(static_cast<specdec::token_id>(3 + rng() % 290));
        const auto before = scorer.positions_computed();
        const Eigen::VectorXf a = scorer.next_logits(context), b = stepper.next_logits(context);
        CHECK((a.array() == b.array()).all());
        CHECK(scorer.positions_computed() - before == 1);  // the accepted path came from the tree's rows
        if (context.size() > 60) context.resize(5);  // roll back now and then
    }
}

TEST_CASE("llama2 score_tree rejects malformed trees", "[tree][llama2]") {
    llama2::transformer m(tiny_model(1));
    specdec::draft_tree t;
    t.add(-1, 5);
    t.add(0, 6);
    t.parents[1] = 1;
    Eigen::MatrixXf out;
    CHECK_THROWS_AS(m.score_tree(std::vector<specdec::token_id>{1}, t, out), std::invalid_argument);
    t.parents[1] = 0;
    t.tokens[1] = 300;
    CHECK_THROWS_AS(m.score_tree(std::vector<specdec::token_id>{1}, t, out), std::out_of_range);
}

TEST_CASE("Tree decoding with the llama2 engine at temperature 0 is greedy decoding", "[tree][llama2]") {
    const auto model = tiny_model(7);
    llama2::transformer target(model), draft(model, 2), reference(model);
    const std::vector<specdec::token_id> prompt{1, 40, 41};
    std::mt19937_64 rng(1);
    const specdec::sampling_config greedy{.temperature = 0.0f};
    const auto want =
        specdec::autoregressive_decode(reference, prompt, {.sampling = greedy, .budget = {.max_new_tokens = 48}}, rng)
            .tokens;
    // Also with the draft's own sampling and the draft-side stop (pruned trees reach the target's
    // cache), and with the adaptive depth (trees of changing depth).
    specdec::adaptive_gamma_options known;
    known.draft_cost = [](std::size_t n) { return 0.1 * static_cast<double>(n); };
    known.pass_cost = [](std::size_t m) { return 1.0 + 0.05 * static_cast<double>(m - 1); };
    known.explore_every = 2;
    known.max_explore_every = 2;
    known.explore_budget = 1.0;
    const specdec::draft_length adaptive{.policy = specdec::gamma_policy::adaptive, .adaptive = known};
    const specdec::draft_settings own_draft{.sampling = specdec::sampling_config{.temperature = 1.0f},
                                            .stop_below = 0.2f};
    for (const auto scheme : {specdec::tree_verification_scheme::traversal,
                              specdec::tree_verification_scheme::recursive_rejection}) {
        for (int variant = 0; variant < 3; ++variant) {
            INFO("scheme " << static_cast<int>(scheme) << ", variant " << variant);
            std::mt19937_64 g(2);
            std::size_t events = 0, one_pass = 0, chain_steps = 0;
            const auto got = specdec::speculative_decode(
                draft, target, prompt,
                {.step = specdec::tree{.shape = {.branching = {3, 2, 1, 1}}, .scheme = scheme},
                 .length = variant == 2 ? adaptive : specdec::draft_length{},
                 .sampling = greedy,
                 .draft = variant == 1 ? own_draft : specdec::draft_settings{},
                 .budget = {.max_new_tokens = 48},
                 .on_step =
                     [&](const specdec::step_event& e) {
                         ++events;
                         // A tree planner's chain plans run as chain steps (one score() pass).
                         one_pass += e.target_passes == 1;
                         chain_steps += e.tree == nullptr;
                     }},
                g);
            CHECK(got.tokens == want);
            CHECK(got.stats.target_calls == got.stats.steps);
            CHECK(one_pass == events);
            if (variant != 2) CHECK(chain_steps == 0);  // a fixed shape: every step a tree
            if (variant == 2) {
                std::size_t depths = 0;
                for (const std::size_t n : got.stats.steps_at_gamma) depths += n != 0;
                CHECK(depths >= 2);
            }
        }
    }
}
