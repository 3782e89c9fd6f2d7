// C++ built without frame pointers (-O2 -fomit-frame-pointer): string sorting and hashing, so
// %rbp, free for the compiler, holds pointers to string and node data. A frame-pointer walk
// (`--unwind fp`) reads those bytes as frames: the unwinding tests check that no such garbage
// frame is shown.
//
// Usage: nofp_strings [SECONDS] (default 5); prints its pid on the first line of stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <unordered_map>
#include <vector>

static volatile unsigned long sink;

__attribute__((noinline)) static std::vector<std::string> make_words(unsigned seed, size_t n)
{
	std::vector<std::string> words;
	words.reserve(n);
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		std::string w = "SPAN_SI" + std::to_string(seed % 100000) + "_word_of_text";
		words.push_back(std::move(w));
	}
	return words;
}

__attribute__((noinline)) static unsigned long count_words(const std::vector<std::string> &words)
{
	std::unordered_map<std::string, unsigned> counts;
	for (const auto &w : words)
		counts[w.substr(0, 12)]++;
	unsigned long total = 0;
	for (const auto &kv : counts)
		total += kv.second * kv.first.size();
	return total;
}

__attribute__((noinline)) static unsigned long sort_words(std::vector<std::string> words)
{
	std::sort(words.begin(), words.end(), [](const std::string &a, const std::string &b) {
		return a.compare(7, std::string::npos, b, 7, std::string::npos) < 0;
	});
	return words.front().size() + words.back().size();
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? std::strtod(argv[1], nullptr) : 5.0;
	if (!(seconds >= 0.0 && seconds <= 3600.0)) {
		std::fprintf(stderr, "usage: %s [SECONDS]  (0 to 3600)\n", argv[0]);
		return 2;
	}
	std::printf("%d\n", (int)getpid());
	std::fflush(stdout);
	auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
	unsigned seed = 1;
	while (std::chrono::steady_clock::now() < end) {
		auto words = make_words(seed++, 4000);
		sink += count_words(words);
		sink += sort_words(std::move(words));
	}
	return 0;
}
