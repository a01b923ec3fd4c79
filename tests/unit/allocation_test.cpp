// Zero heap allocations per step after warm-up, shown with a counting global operator new and
// Eigen's allocation check (support/allocation_counter.hpp, which replaces the global
// allocation functions: this file is its own test executable).
#include "support/allocation_counter.hpp"

#include "support/catch.hpp"
#include "support/skip.hpp"
#include "support/markov.hpp"

#include <specdec/specdec.hpp>

#include <random>
#include <vector>

namespace {

using specdec::token_id;
using specdec_test::allocations_during;
using specdec_test::counting_available;

/// A target that writes its scores in place (Eigen::MatrixXf storage reused).
struct in_place_target {
    specdec_test::markov_model* model;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    Eigen::MatrixXf score(std::span<const token_id> c, std::span<const token_id> d) {
        Eigen::MatrixXf out;
        score_into(c, d, out);
        return out;
    }
    void score_into(std::span<const token_id> context, std::span<const token_id> draft, Eigen::MatrixXf& out) {
        out.resize(model->vocab, static_cast<Eigen::Index>(draft.size() + 1));
        for (std::size_t j = 0; j <= draft.size(); ++j) {
            // The Markov model reads the last two tokens of context + draft[0..j).
            token_id prev2[2];
            for (int k = 0; k < 2; ++k) {
                const std::ptrdiff_t pos = static_cast<std::ptrdiff_t>(j) - 1 - k;
                prev2[1 - k] = pos >= 0 ? draft[static_cast<std::size_t>(pos)]
                                        : (static_cast<std::ptrdiff_t>(context.size()) + pos >= 0
                                               ? context[context.size() + static_cast<std::size_t>(pos)]
                                               : 0);
            }
            const std::size_t row = model->row_of(std::span<const token_id>(prev2, 2)) * static_cast<std::size_t>(model->vocab);
            out.col(static_cast<Eigen::Index>(j)) = Eigen::Map<const Eigen::VectorXf>(model->table.data() + row, model->vocab);
        }
    }
};

/// A block drafter with distributions that reuses the block's storage.
struct in_place_drafter {
    specdec_test::markov_model* model;
    specdec::sampling_workspace ws;
    std::vector<token_id> ctx;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    void draft(std::span<const token_id> context, std::size_t gamma, const specdec::sampling_config& s,
               specdec::uniform_source& u, specdec::draft_block& out) {
        out.tokens.clear();
        out.resize_probs(model->vocab, static_cast<Eigen::Index>(gamma));
        ctx.assign(context.end() - 2, context.end());
        for (std::size_t i = 0; i < gamma; ++i) {
            const std::size_t row = model->row_of(std::span<const token_id>(ctx.data() + ctx.size() - 2, 2)) *
                                    static_cast<std::size_t>(model->vocab);
            auto q = out.probs.col(static_cast<Eigen::Index>(i));
            specdec::standardize(Eigen::Map<const Eigen::VectorXf>(model->table.data() + row, model->vocab), s, q, ws);
            const auto x = static_cast<token_id>(specdec::sample_from_weights(q, u(), ws));
            out.tokens.push_back(x);
            ctx.push_back(x);
        }
    }
};

}  // namespace

TEST_CASE("verify allocates nothing after warm-up, for every scheme and sampling mode", "[allocation]") {
    if (!counting_available()) return;
    const int vocab = 32000, gamma = 4;
    std::mt19937_64 rng(1);
    Eigen::MatrixXf z = Eigen::MatrixXf::Random(vocab, gamma + 1) * 4.0f;
    Eigen::MatrixXf q = (Eigen::MatrixXf::Random(vocab, gamma).array() + 1.0f).matrix();
    for (int j = 0; j < gamma; ++j) q.col(j) /= q.col(j).sum();
    const std::vector<token_id> draft{1, 2, 3, 4};
    specdec::verify_workspace ws;
    const specdec::sampling_config settings[] = {{}, {.temperature = 0.0f}, {.top_k = 40}, {.top_p = 0.9f}};
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        for (const auto& s : settings) {
            const specdec::verify_options o{.scheme = scheme};
            for (int i = 0; i < 3; ++i) {  // warm-up
                (void)specdec::verify(z, draft, q, s, rng, ws, o);
                (void)specdec::verify(z, draft, specdec::point_mass, s, rng, ws, o);
            }
            const auto n = allocations_during([&] {
                for (int i = 0; i < 20; ++i) {
                    (void)specdec::verify(z, draft, q, s, rng, ws, o);
                    (void)specdec::verify(z, draft, specdec::point_mass, s, rng, ws, o);
                }
            });
            INFO("temperature " << s.temperature << " top_k " << s.top_k << " top_p " << s.top_p);
            CHECK(n == 0);
        }
    }
}

TEST_CASE("A speculative step allocates nothing after warm-up when the adapters reuse their buffers",
          "[allocation]") {
    if (!counting_available()) return;
    auto target = specdec_test::markov_model::random(512, 2, 1);
    auto draft_model = specdec_test::markov_model::random(512, 2, 2);
    in_place_target verifier{&target};
    in_place_drafter drafter{&draft_model, {}, {}};
    std::vector<token_id> seq{0, 1};
    seq.reserve(100000);
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    std::mt19937_64 rng(3);
    for (const auto scheme : {specdec::verification_scheme::token, specdec::verification_scheme::block}) {
        const specdec::step_options opts{.gamma = 5, .sampling = {.temperature = 0.8f, .top_p = 0.95f}, .scheme = scheme};
        for (int i = 0; i < 10; ++i) specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws);
        const auto before = seq.size();
        const auto n = allocations_during([&] {
            for (int i = 0; i < 200; ++i) specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws);
        });
        CHECK(seq.size() > before);
        CHECK(n == 0);
    }
}

TEST_CASE("A fallback from prompt lookup to a model drafter allocates nothing after warm-up", "[allocation]") {
    // The step clears the block before each draft, so lookup's point masses and the model's
    // columns alternate in one block: the columns' storage must survive the point-mass steps.
    if (!counting_available()) return;
    auto target = specdec_test::markov_model::random(512, 2, 1);
    auto draft_model = specdec_test::markov_model::random(512, 2, 2);
    struct mapped_model {  // next_logits returns a view of the table, as an engine's buffer would be
        specdec_test::markov_model* model;
        std::ptrdiff_t vocab_size() const { return model->vocab; }
        Eigen::Map<const Eigen::VectorXf> next_logits(std::span<const token_id> c) const {
            const std::size_t row = model->row_of(c) * static_cast<std::size_t>(model->vocab);
            return Eigen::Map<const Eigen::VectorXf>(model->table.data() + row, model->vocab);
        }
    } small{&draft_model};
    in_place_target verifier{&target};
    specdec::prompt_lookup_drafter lookup(512, 3, 1);
    specdec::fallback_drafter drafter(lookup, small);
    std::vector<token_id> seq{0, 1};
    seq.reserve(100000);
    specdec::decode_stats stats;
    specdec::step_workspace ws;
    std::mt19937_64 rng(5);
    const specdec::step_options opts{.gamma = 4, .sampling = {.temperature = 0.3f}};
    // Warm-up on a context longer than any measured one: the model drafter copies the context
    // into its own buffer, whose capacity then suffices.
    while (seq.size() < 3000) specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws);
    seq.resize(1000);
    int by_lookup = 0, by_model = 0;
    const auto n = allocations_during([&] {
        for (int i = 0; i < 300; ++i) {
            specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws);
            (drafter.last_used() == 0 ? by_lookup : by_model) += 1;
        }
    });
    CHECK(by_lookup > 0);
    CHECK(by_model > 0);
    CHECK(n == 0);
}

TEST_CASE("A sequence without reserved room grows geometrically, not by a copy every step", "[allocation]") {
    // Each step appends a few tokens; growing the sequence by exactly what a step needs would
    // reallocate and copy it on every step once its capacity is used up (quadratic time).
    if (!counting_available()) return;
    auto target = specdec_test::markov_model::random(512, 1, 1);
    auto draft_model = specdec_test::markov_model::random(512, 1, 2);
    in_place_target verifier{&target};
    in_place_drafter drafter{&draft_model, {}, {}};
    const specdec::step_options opts{.gamma = 4, .sampling = {.temperature = 0.8f}};
    SECTION("speculative_step on the caller's sequence") {
        std::vector<token_id> seq{0, 1};
        specdec::decode_stats stats;
        specdec::step_workspace ws;
        std::mt19937_64 rng(3);
        for (int i = 0; i < 10; ++i) specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws);
        const auto n = allocations_during([&] {
            for (int i = 0; i < 3000; ++i) specdec::speculative_step(drafter, verifier, seq, stats, opts, rng, ws);
        });
        CHECK(seq.size() > 3000);
        CHECK(n <= 16);  // one per doubling of the capacity: log2(15000 / 10) < 11
    }
    SECTION("speculative_decode past its initial reservation") {
        const std::vector<token_id> prompt{0, 1};
        std::mt19937_64 rng(4);
        std::size_t produced = 0;
        const auto n = allocations_during([&] {
            const specdec::decode_result r = specdec::speculative_decode(
                drafter, verifier, prompt,
                specdec::decode_options{.step = specdec::chain{.gamma = 4},
                                        .sampling = {.temperature = 0.8f},
                                        .budget = {.max_new_tokens = 20000}},
                rng);
            produced = r.tokens.size();
        });
        CHECK(produced == 20000);
        // The first step's buffers, the reservation of prompt + 4096 tokens, then a few doublings;
        // a copy per step past 4096 tokens would be thousands.
        CHECK(n <= 100);
    }
}

TEST_CASE("Top-p allocates nothing after warm-up however many weights share its threshold's bucket",
          "[allocation]") {
    // How many weights fall in the magnitude bucket where the nucleus ends depends on the row:
    // a few on random rows, every one on a flat row. Warmed up on random rows, the workspace
    // must already hold room for the flat row's.
    if (!counting_available()) return;
    const int vocab = 4096;
    std::mt19937_64 g(7);
    std::normal_distribution<float> n(0.0f, 3.0f);
    Eigen::VectorXf logits(vocab), out(vocab);
    specdec::sampling_workspace ws;
    const specdec::sampling_config s{.top_p = 0.9f};
    for (int i = 0; i < 3; ++i) {  // warm-up
        for (Eigen::Index k = 0; k < vocab; ++k) logits[k] = n(g);
        specdec::standardize(logits, s, out, ws);
    }
    const Eigen::VectorXf flat = Eigen::VectorXf::Zero(vocab);
    const auto count = allocations_during([&] { specdec::standardize(flat, s, out, ws); });
    CHECK(out.minCoeff() == out.maxCoeff());  // ties kept: the flat row stays flat
    CHECK(count == 0);
}

TEST_CASE("The counting allocator sees allocations (negative control)", "[allocation]") {
    if (!counting_available()) return;
    const auto n = allocations_during([] {
        std::vector<int> v(100);
        (void)v;
    });
    CHECK(n == 1);
    // ... and Eigen's, which come from malloc.
    const auto m = allocations_during([] {
        Eigen::MatrixXf a(100, 3);
        a.resize(50, 2);
        (void)a;
    });
    CHECK(m == 2);
}

namespace {

/// A Markov model that is both a TreeVerifier and (through score_tree per level) a tree
/// drafter, scoring in place: tree decoding with it allocates only what the library does.
struct in_place_tree_markov {
    specdec_test::markov_model* model;
    std::ptrdiff_t vocab_size() const { return model->vocab; }
    Eigen::VectorXf next_logits(std::span<const token_id> context) { return model->next_logits(context); }
    void score_tree(std::span<const token_id> context, const specdec::draft_tree& tree, Eigen::MatrixXf& out) {
        out.resize(model->vocab, static_cast<Eigen::Index>(tree.size() + 1));
        for (std::size_t c = 0; c <= tree.size(); ++c) {
            // The last two tokens of context + the path to node c − 1 (none for the root).
            token_id last[2];
            std::int32_t v = static_cast<std::int32_t>(c) - 1;
            std::size_t from_context = 0;
            for (int k = 1; k >= 0; --k) {
                if (v >= 0) {
                    last[k] = tree.tokens[static_cast<std::size_t>(v)];
                    v = tree.parents[static_cast<std::size_t>(v)];
                } else {
                    ++from_context;
                    last[k] = context.size() >= from_context ? context[context.size() - from_context] : 0;
                }
            }
            const std::size_t row = model->row_of(std::span<const token_id>(last, 2)) * static_cast<std::size_t>(model->vocab);
            out.col(static_cast<Eigen::Index>(c)) = Eigen::Map<const Eigen::VectorXf>(model->table.data() + row, model->vocab);
        }
    }
};
static_assert(specdec::TreeVerifier<in_place_tree_markov>);

}  // namespace

TEST_CASE("Tree verification allocates nothing after warm-up, for both schemes and every kind of tree",
          "[allocation][tree]") {
    if (!counting_available()) return;
    const int vocab = 4096;  // two row blocks; the tables take vocab² floats each
    auto target = specdec_test::markov_model::random(vocab, 1, 11, 3.0f);
    auto draft = specdec_test::markov_model::random(vocab, 1, 12, 3.0f);
    in_place_tree_markov t{&target}, d{&draft};
    const std::vector<token_id> context{5, 9};
    for (const auto draws : {specdec::sibling_draws::iid, specdec::sibling_draws::without_replacement}) {
        for (const bool point_masses : {false, true}) {
            for (const auto scheme :
                 {specdec::tree_verification_scheme::traversal, specdec::tree_verification_scheme::recursive_rejection}) {
                for (const specdec::sampling_config s : {specdec::sampling_config{.temperature = 1.0f},
                                                         specdec::sampling_config{.temperature = 0.0f},
                                                         specdec::sampling_config{.temperature = 0.8f, .top_k = 40}}) {
                    INFO("draws " << static_cast<int>(draws) << ", point masses " << point_masses << ", scheme "
                                  << static_cast<int>(scheme) << ", T " << s.temperature << ", top-k " << s.top_k);
                    std::mt19937_64 rng(3);
                    specdec::uniform_source u(rng);
                    specdec::draft_tree tree;
                    std::vector<token_id> path;
                    Eigen::VectorXf logits, q, scratch;
                    Eigen::MatrixXf scores;
                    std::vector<Eigen::MatrixXf> draft_scores;
                    specdec::sampling_workspace sws;
                    specdec::tree_verify_workspace ws;
                    const specdec::tree_shape shape{.branching = {3, 2, 1, 1}, .draws = draws};
                    const specdec::tree_verify_options o{.scheme = scheme};
                    std::size_t drafting = 0, verifying = 0;
                    auto step = [&] {
                        drafting += allocations_during([&] {
                            tree.clear();
                            specdec::draft_tree_from_model(d, context, shape, {.temperature = 1.0f}, u, tree, path,
                                                           logits, q, scratch, sws, draft_scores);
                            if (point_masses) tree.resize_probs(0, 0);
                        });
                        t.score_tree(context, tree, scores);
                        verifying += allocations_during([&] { (void)specdec::verify_tree(scores, tree, s, rng, ws, o); });
                    };
                    for (int i = 0; i < 3; ++i) step();  // warm-up
                    drafting = verifying = 0;
                    for (int i = 0; i < 20; ++i) step();
                    CHECK(drafting == 0);
                    CHECK(verifying == 0);
                }
            }
        }
    }
}

TEST_CASE("Tree decoding allocates nothing per step (a long run allocates a bounded number of times)",
          "[allocation][tree]") {
    // Decoding 3000 tokens takes hundreds of steps: an allocation per step would show as
    // hundreds. What remains is the decoder's own state (its sequence, the tree workspace), the
    // first step's buffers, the reservation of the output, and the last steps' smaller trees;
    // so a run of half the length allocates about as often.
    if (!counting_available()) return;
    auto target = specdec_test::markov_model::random(512, 1, 21);
    auto draft = specdec_test::markov_model::random(512, 1, 22);
    in_place_tree_markov t{&target}, d{&draft};
    const std::vector<token_id> prompt{0, 1};
    for (const auto scheme :
         {specdec::tree_verification_scheme::traversal, specdec::tree_verification_scheme::recursive_rejection}) {
        std::size_t counts[2] = {}, steps[2] = {};
        for (const std::size_t length : {std::size_t{1500}, std::size_t{3000}}) {
            const std::size_t k = length == 3000 ? 1 : 0;
            std::mt19937_64 rng(4);
            std::size_t produced = 0;
            counts[k] = allocations_during([&] {
                const specdec::decode_result r = specdec::speculative_decode(
                    d, t, prompt,
                    specdec::decode_options{
                        .step = specdec::tree{.shape = {.branching = {2, 2, 1, 1}}, .scheme = scheme},
                        .sampling = {.temperature = 0.8f},
                        .budget = {.max_new_tokens = length}},
                    rng);
                produced = r.tokens.size();
                steps[k] = r.stats.steps;
            });
            CHECK(produced == length);
        }
        INFO("scheme " << static_cast<int>(scheme) << ": " << counts[1] << " allocations in " << steps[1] << " steps, "
                       << counts[0] << " in " << steps[0]);
        CHECK(steps[1] > 500);
        // 50 at a10c06e (speculative_decode_tree), 58 at 92bcf29 (the one decoding loop: the
        // decoder's entry, tree workspace, id table and item list, copies of the shape, the
        // accepted-path buffer): a fixed cost per call. An allocation per step would be over 2000.
        CHECK(counts[1] <= 100);
        CHECK(counts[1] <= counts[0] + 4);  // twice the steps, (about) the same count
    }
}

TEST_CASE("Tree decoding with the draft's own sampling, the adaptive depth and the draft-side stop allocates only "
          "on steps that change the tree's size",
          "[allocation][tree]") {
    // Step by step (batch_decoder, as speculative_decode runs it): a step whose tree has the
    // size of the step before allocates nothing once the buffers have grown. A new size does
    // (the adaptive policy's change of depth), and so does the draft-side stop: a step it
    // prunes copies the nodes kept into new probs (prune_tree_below), the next step regrows
    // them, and the verifier resizes its scores. So the count is bounded by the steps that
    // change the size or are pruned (or follow one that was), not by the steps.
    if (!counting_available()) return;
    auto target = specdec_test::markov_model::random(512, 1, 23);
    auto draft = target;  // a draft close to the target, so the adaptive depth stays deep
    {
        std::mt19937_64 g(5);
        std::normal_distribution<float> noise(0.0f, 0.5f);  // test data only
        for (float& x : draft.table) x += noise(g);
    }
    in_place_tree_markov t{&target}, d{&draft};
    const std::vector<token_id> prompt{0, 1};
    specdec::adaptive_gamma_options known;
    known.draft_cost = [](std::size_t n) { return 0.02 * static_cast<double>(n); };
    known.pass_cost = [](std::size_t m) { return 1.0 + 0.02 * static_cast<double>(m - 1); };
    const specdec::tree_shape shape{.branching = {2, 2, 1, 1}};
    for (const float stop_below : {0.0f, 0.012f}) {
        for (const auto scheme :
             {specdec::tree_verification_scheme::traversal, specdec::tree_verification_scheme::recursive_rejection}) {
            specdec::gamma_controller controller =
                specdec::make_controller({.step = specdec::tree{.shape = shape}, .length = {.adaptive = known}});
            std::size_t size = 0;  // the tree of the step just taken
            bool pruned = false;   // and whether the stop pruned it
            specdec::tree_shape planned{.branching = {}}, cut{.branching = {}};
            planned.branching.reserve(8);
            planned.children.reserve(128);
            cut.branching.reserve(8);
            cut.children.reserve(128);
            const specdec::decode_options options{
                .step = specdec::tree{.shape = shape, .scheme = scheme},
                .length = {.policy = specdec::gamma_policy::adaptive, .controller = &controller},
                .sampling = {.temperature = 0.8f},
                .draft = {.sampling = specdec::sampling_config{.temperature = 1.0f, .top_k = 50},
                          .stop_below = stop_below},
                .budget = {.max_new_tokens = 3000},
                .on_step =
                    [&](const specdec::step_event& e) {
                        size = e.tree != nullptr ? e.tree->size() : 0;
                        // The planned tree (a uniform shape, or a best tree's children list) cut to
                        // the depth asked: a tree with fewer nodes was pruned.
                        // (Into shapes kept across steps: the callback allocates nothing itself.)
                        const auto plan = controller.planned_shape();
                        const auto children = controller.planned_children();
                        planned.branching.assign(plan.begin(), plan.end());
                        planned.children.assign(children.begin(), children.end());
                        planned.cut(e.gamma, cut);
                        pruned = size < cut.nodes();
                    }};
            specdec::batch_decoder dec(d, t, options);
            const std::size_t id = dec.add(prompt, std::mt19937_64(6));
            std::size_t steps = 0, quiet = 0, quiet_allocations = 0, changes = 0, pruned_steps = 0, total = 0;
            std::size_t last = 0;
            bool last_pruned = false;
            while (dec.active() != 0) {
                const std::size_t n = allocations_during([&] { dec.step(); });
                total += n;
                pruned_steps += pruned;
                if (steps != 0 && size == last && !pruned && !last_pruned) {
                    ++quiet;
                    quiet_allocations += n;
                } else {
                    ++changes;
                }
                last = size;
                last_pruned = pruned;
                ++steps;
            }
            std::size_t depths = 0;
            for (const std::size_t c : controller.choices()) depths += c != 0;
            INFO("stop " << stop_below << ", scheme " << static_cast<int>(scheme) << ": " << total << " allocations in "
                         << steps << " steps (" << pruned_steps << " pruned), " << changes
                         << " of them changing the tree's size, pruned or after a pruned one; " << quiet_allocations
                         << " allocations in the " << quiet << " others; " << depths << " depths used");
            CHECK(dec.generated(id).size() == 3000);
            CHECK(depths >= 2);
            CHECK(quiet > 100);
            CHECK(quiet_allocations <= 8);  // the buffers' growth on the way, not one per step
            CHECK(total <= 100 + 6 * changes);
            if (stop_below > 0.0f) CHECK(pruned_steps * 10 > steps);  // the stop pruned, often
            else CHECK(pruned_steps == 0);
        }
    }
}
