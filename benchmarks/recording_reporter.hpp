#pragma once
// Google Benchmark's console display that also keeps what each reported run measured, so that a
// benchmark binary can print a derived table after its runs: the CPU seconds per iteration (key
// "cpu_seconds") and every user counter, for each repetition, or, when only aggregates are
// reported (--benchmark_report_aggregates_only), for the median aggregate.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace specdec_bench {

/// The median of `v` (not empty).
inline double median_of(std::vector<double> v) {
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    if (v.size() % 2 == 1) return *mid;
    return (*mid + *std::max_element(v.begin(), mid)) / 2.0;
}

class recording_reporter : public benchmark::ConsoleReporter {
public:
    using benchmark::ConsoleReporter::ConsoleReporter;

    void ReportRuns(const std::vector<Run>& runs) override {
        benchmark::ConsoleReporter::ReportRuns(runs);
        for (const Run& r : runs) {
            const bool is_median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
            if (r.error_occurred || (r.run_type != Run::RT_Iteration && !is_median)) continue;
            const std::string& args = r.run_name.args;
            auto& slot = (is_median ? medians_ : repetitions_)[r.run_name.function_name + (args.empty() ? "" : "/" + args)];
            slot["cpu_seconds"].push_back(r.GetAdjustedCPUTime() / benchmark::GetTimeUnitMultiplier(r.time_unit));
            for (const auto& [name, counter] : r.counters) slot[name].push_back(counter.value);
        }
    }

    /// Median over the repetitions of `key` ("cpu_seconds" or a counter name) of benchmark `name`
    /// ("function/args"); nullopt when it did not run.
    [[nodiscard]] std::optional<double> median(const std::string& name, const std::string& key) const {
        for (const auto* runs : {&repetitions_, &medians_}) {
            const auto it = runs->find(name);
            if (it == runs->end()) continue;
            const auto c = it->second.find(key);
            if (c != it->second.end() && !c->second.empty()) return median_of(c->second);
        }
        return std::nullopt;
    }

private:
    // benchmark name -> key -> values
    std::map<std::string, std::map<std::string, std::vector<double>>> repetitions_, medians_;
};

}  // namespace specdec_bench
