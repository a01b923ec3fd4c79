// Runs the battery of both translation units (tu.cpp compiled as a and as b) and prints:
//   tu a: <vector extensions>            (and tu b)
//   item <name> n=<words> a=<hash> b=<hash>[ first difference: word <i> a=<word> b=<word>]
//   total a=<hash> b=<hash>
// The hashes are FNV-1a over every word. compare.cmake runs this program linked in both orders and
// compares the lines. With --words, prints every word instead: "<tu> <item> <index> <word>".

#include "odr.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

std::uint64_t fnv1a(const std::vector<std::uint32_t>& words, std::uint64_t h = 0xcbf29ce484222325ull) {
    for (const std::uint32_t w : words)
        for (int byte = 0; byte < 4; ++byte) {
            h ^= (w >> (8 * byte)) & 0xffu;
            h *= 0x100000001b3ull;
        }
    return h;
}

std::uint32_t word_or_zero(const std::vector<std::uint32_t>& w, std::size_t i) { return i < w.size() ? w[i] : 0u; }

}  // namespace

int main(int argc, char** argv) {
    const specdec_odr::battery a = specdec_odr::run_a();
    const specdec_odr::battery b = specdec_odr::run_b();
    if (a.items.size() != b.items.size()) {
        std::printf("error: TU a has %zu items, TU b %zu\n", a.items.size(), b.items.size());
        return 1;
    }
    if (argc > 1 && std::strcmp(argv[1], "--words") == 0) {
        for (const auto* tu : {&a, &b})
            for (const specdec_odr::item& it : tu->items)
                for (std::size_t i = 0; i < it.words.size(); ++i)
                    std::printf("%c %s %zu %08x\n", tu == &a ? 'a' : 'b', it.name.c_str(), i, it.words[i]);
        return 0;
    }
    std::printf("tu a: %s\ntu b: %s\n", a.isa.c_str(), b.isa.c_str());
    std::uint64_t total_a = 0xcbf29ce484222325ull, total_b = total_a;
    for (std::size_t k = 0; k < a.items.size(); ++k) {
        const specdec_odr::item& x = a.items[k];
        const specdec_odr::item& y = b.items[k];
        if (x.name != y.name) {
            std::printf("error: item %zu is %s in TU a, %s in TU b\n", k, x.name.c_str(), y.name.c_str());
            return 1;
        }
        total_a = fnv1a(x.words, total_a);
        total_b = fnv1a(y.words, total_b);
        std::printf("item %s n=%zu a=%016llx b=%016llx", x.name.c_str(), x.words.size(),
                    static_cast<unsigned long long>(fnv1a(x.words)), static_cast<unsigned long long>(fnv1a(y.words)));
        const std::size_t n = x.words.size() > y.words.size() ? x.words.size() : y.words.size();
        for (std::size_t i = 0; i < n; ++i)
            if (i >= x.words.size() || i >= y.words.size() || x.words[i] != y.words[i]) {
                std::printf(" first difference: word %zu a=%08x b=%08x", i, word_or_zero(x.words, i),
                            word_or_zero(y.words, i));
                break;
            }
        std::printf("\n");
    }
    std::printf("total a=%016llx b=%016llx\n", static_cast<unsigned long long>(total_a),
                static_cast<unsigned long long>(total_b));
    return 0;
}
