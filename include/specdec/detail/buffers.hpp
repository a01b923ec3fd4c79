#pragma once
/// \file
/// The storage behind specdec::sampling_workspace and specdec::verify_workspace, and where
/// verification keeps each row's blocks, chunks and lanes in it.

#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "row_layout.hpp"
#include "vocabulary.hpp"

namespace specdec::detail {

/// The storage behind specdec::sampling_workspace: scratch for the truncating filters and the
/// blockwise draws, reused across calls so that sampling allocates nothing after warm-up.
struct sampling_buffers {
    std::vector<float> values;        ///< scratch copy for selection (top-k, top-p)
    std::vector<double> block_sums;   ///< per-block sums for blocked inverse-CDF sampling
    std::vector<double> buckets;      ///< per-magnitude masses for top-p
    std::vector<float> block_refs;    ///< per-block exp references of standardize_and_sample
};

/// A target row that verification has normalized (Sec. 2.2 standardization applied).
///  - greedy (temperature 0): only the argmax is kept;
///  - plain: known by its per-block maxima, scales and masses (ws.block_max, ws.scale,
///    ws.block_mass), from which p(x) of one token or the weights of one block are recomputed;
///  - stored (truncating sampling): standardize() wrote p into ws.rows; block scales are 1.
struct target_row {
    enum class form : unsigned char { greedy, plain, stored };
    std::size_t column = 0;  // column j of the logits (and of ws.rows)
    form kind = form::plain;
    Eigen::Index argmax = 0;  // greedy rows
    float inv_t = 1.0f;
    bool q_lanes = false;  // plain rows: the pass also kept the draft column's lane sums (ws.q_lanes)
    bool exps = false;     // plain rows: the pass also wrote its exponentials to ws.rows (short rows)
};

/// Plain rows of at most this many tokens keep the exponentials of their normalizing pass
/// (in ws.rows; a few KB, written while they are in registers), so that a draw or a residual
/// pass over them reads instead of recomputing exps. On short rows those passes cost as much
/// as the normalizing pass itself; on long ones writing the row would cost bandwidth.
inline constexpr Eigen::Index kept_row_limit = row_block;

/// True when row r's values are in ws.rows: p for stored rows (whose block scales are 1), the
/// pass's exponentials for plain rows that kept them; either way p = that value times the
/// block's scale.
inline bool in_rows(const target_row& r) { return r.kind == target_row::form::stored || r.exps; }

/// The storage behind specdec::verify_workspace.
struct verify_buffers {
    /// Target rows written out: under truncating sampling (top-k, top-p, min-p need the whole
    /// distribution) column j holds the standardized probabilities of row j; otherwise, for
    /// rows of at most detail::kept_row_limit tokens, the exponentials of row j's pass.
    Eigen::MatrixXf rows;
    std::vector<float> block_max;    ///< per row and block: the block's largest logit
    std::vector<float> scale;        ///< per row and block: the factor that turns exp((z − m_b) / T) into p
    std::vector<double> block_mass;  ///< per row and block: the probability mass of the block
    std::vector<float> chunk_lanes;  ///< per row and 256-token chunk: its lane sums of exp((z − m_b) / T)
    std::vector<float> q_lanes;      ///< the same lane sums of the draft column (block verification's bound)
    std::vector<double> sums;        ///< block weights of an exact residual draw
    /// Running sums of one row's block masses (block_prefix), for draws from p; apart from
    /// `sums`, which a point mass's residual keeps through its proposals from p.
    std::vector<double> prefix;
    std::vector<double> eta;         ///< block verification: η_1..η_γ
    std::vector<double> weight;      ///< block verification: w_1..w_γ
    std::vector<double> p_draft;     ///< block verification: p_i(x_i)
    std::vector<double> q_draft;     ///< block verification: q_i(x_i)
    std::vector<target_row> prepared;  ///< block verification: the rows normalized
    std::vector<float> block;        ///< the weights of one block during a draw
    sampling_buffers sampling;
    std::size_t rows_prepared = 0;   ///< target rows normalized since the count was last reset
};

/// The storage behind specdec::tree_verify_workspace: per level of the tree's recursion the
/// weights of its measure (one column of V floats), their block sums, their factor and their
/// sum (see detail/tree_verification.inc); the children lists and per-node draft factors of the tree
/// being verified; the result of the last verification.
struct tree_buffers {
    std::vector<std::int32_t> first_child, next_sibling;  ///< indexed by node + 1 (0: the root)
    std::vector<double> q_scale;                          ///< per node: q_c = q_scale · column c (0: not yet known)
    std::vector<token_id> removed;                        ///< the tokens a draw without replacement excluded
    std::vector<unsigned char> excludes_earlier;          ///< per node: drawn without its earlier siblings
    Eigen::MatrixXf levels;                               ///< V x levels: the weights of each level
    std::vector<double> block_sums;                       ///< levels x row blocks: f_b Σ_block weights
    std::vector<double> block_factors;                    ///< levels x row blocks: f_b
    std::vector<double> level_scale, level_sum;           ///< per level: μ = scale · weights; Σ weights
    std::vector<std::pair<token_id, float>> kept;         ///< weights kept through a rejection
    std::vector<float> block_refs;                        ///< per block: the reference of its exps
    std::vector<float> siblings;                          ///< a_k of the root's tested children
    sampling_buffers sampling;
    verify_buffers chain;                                 ///< chain-shaped trees: block verification's
    std::size_t rows_read = 0;
    std::int32_t last_node = -1;
    token_id next_token = 0;
};

/// Offset of row j's per-block entries in ws.block_max / scale / block_mass.
inline std::size_t block_base(Eigen::Index vocab, std::size_t j) {
    return j * static_cast<std::size_t>(blocks_of(vocab));
}

/// Chunks of exp_chunk elements per row block, and the lane sums of block b of row j.
inline constexpr Eigen::Index chunks_per_block = row_block / exp_chunk;
inline std::size_t chunk_offset(Eigen::Index vocab, std::size_t j, Eigen::Index b) {
    const std::size_t block = block_base(vocab, j) + static_cast<std::size_t>(b);
    return block * static_cast<std::size_t>(chunks_per_block * chunk_lanes);
}
inline float* chunk_data(verify_buffers& ws, Eigen::Index vocab, std::size_t j, Eigen::Index b) {
    return ws.chunk_lanes.data() + chunk_offset(vocab, j, b);
}
inline const float* chunk_data(const verify_buffers& ws, Eigen::Index vocab, std::size_t j, Eigen::Index b) {
    return ws.chunk_lanes.data() + chunk_offset(vocab, j, b);
}


/// Sizes the workspace for a verification of n drafts over a vocabulary of V tokens: the
/// per-block buffers of n + 1 rows, the stored rows where the row passes keep them (truncated
/// rows, or rows of at most kept_row_limit tokens), and the block sums of one row's draws
/// (ws.sums, ws.prefix). Grows only, so a shorter draft reuses storage and a warmed-up
/// workspace allocates nothing.
inline void reserve_rows(verify_buffers& ws, Eigen::Index vocab, std::size_t n, const sampling_config& s) {
    if (s.temperature == 0.0f) return;  // greedy rows keep nothing
    const auto cols = static_cast<Eigen::Index>(n + 1);
    // If an allocation fails, the buffers stay usable: a new matrix is allocated before it
    // replaces the old one (Eigen's resize frees first), and `scale`, whose size the row passes
    // trust for all the per-block buffers, grows last.
    if ((truncates(s) || vocab <= kept_row_limit) && (ws.rows.rows() != vocab || ws.rows.cols() < cols)) {
        Eigen::MatrixXf fresh(vocab, cols);
        ws.rows.swap(fresh);
    }
    const auto nb = static_cast<std::size_t>(blocks_of(vocab));
    if (ws.prefix.size() < nb) ws.prefix.resize(nb);  // (each on its own: a failed resize leaves the
    if (ws.sums.size() < nb) ws.sums.resize(nb);      // other as it was, and the next call tries again)
    const std::size_t need = nb * static_cast<std::size_t>(cols);
    if (ws.scale.size() < need) {
        ws.block_max.resize(need);
        ws.block_mass.resize(need);
        ws.chunk_lanes.resize(need * static_cast<std::size_t>(chunks_per_block * chunk_lanes));
        ws.q_lanes.resize(ws.chunk_lanes.size());
        ws.scale.resize(need);
    }
    if (ws.block.size() < static_cast<std::size_t>(row_block)) ws.block.resize(static_cast<std::size_t>(row_block));
}


/// Gives the library's own code the buffers behind a workspace (the workspaces' members are
/// private: their layout is no part of the API).
struct buffers_access {
    template <class Workspace>
    static auto& of(Workspace& ws) noexcept {
        return ws.buffers_;
    }
};

}  // namespace specdec::detail
