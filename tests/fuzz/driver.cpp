// A main() for the fuzz targets where libFuzzer is not at hand (GCC): runs
// every file of the corpus directories given, then mutates them (bit flips,
// byte changes, insertions, deletions, truncations, splices of two inputs)
// for the seconds given, from a fixed seed, so a run is repeatable. A
// crash, a sanitizer report or an abort in the target ends the process with
// the input that caused it written to crash-input. With clang,
// scripts/fuzz.py builds the same targets with -fsanitize=fuzzer instead.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string current;  // the input being run, written out if it crashes

void run(const std::string& input) {
  current = input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

void saveOnAbort(int) {
  std::ofstream("crash-input", std::ios::binary) << current;
  std::fprintf(stderr, "the target aborted on an input of %zu bytes, written to crash-input\n", current.size());
  std::signal(SIGABRT, SIG_DFL);
  std::abort();
}

std::string mutate(std::string s, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const int steps = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < steps; ++i) {
    switch (rng() % 7) {
      case 0:
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
        break;
      case 2:
        s.insert(s.begin() + static_cast<long>(pick(s.size() + 1)), static_cast<char>(rng()));
        break;
      case 3:
        if (!s.empty()) s.erase(pick(s.size()), 1 + pick(8));
        break;
      case 4:
        s.resize(pick(s.size() + 1));
        break;
      case 5: {  // an interesting value over 1, 2, 4 or 8 bytes
        static const uint64_t values[] = {0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fffffff, 0xffffffff, ~uint64_t(0)};
        const uint64_t v = values[pick(std::size(values))];
        const size_t width = size_t(1) << pick(4);
        if (s.size() >= width) std::memcpy(&s[pick(s.size() - width + 1)], &v, width);
        break;
      }
      default: {
        const std::string& other = corpus[pick(corpus.size())];
        s = s.substr(0, pick(s.size() + 1)) + other.substr(pick(other.size() + 1));
      }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("-max_total_time=", 0) == 0) {
      seconds = std::atof(arg.c_str() + 16);
      continue;
    }
    for (const auto& e : std::filesystem::directory_iterator(arg)) {
      std::ifstream f(e.path(), std::ios::binary);
      corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
  }
  if (corpus.empty()) corpus.emplace_back();
  std::signal(SIGABRT, saveOnAbort);
  for (const auto& c : corpus) run(c);
  std::mt19937_64 rng(0x726f6365);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = corpus.size();
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 256; ++i, ++runs) run(mutate(corpus[runs % corpus.size()], corpus, rng));
  }
  std::printf("%llu inputs, %zu in the corpus\n", static_cast<unsigned long long>(runs), corpus.size());
  return 0;
}
