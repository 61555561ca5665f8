// The library's messages name option fields in backticks and the program writes them as its flags
// (apps/option_names.h). Besides the mapping itself, this scans the library's sources: every backticked name in
// a string literal must be in the program's table, and no literal may name a flag of the program.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "apps/option_names.h"
#include "support/processes.h"

namespace tandem::app {
namespace {

namespace fs = std::filesystem;

TEST(WithFlagNames, WritesEachFieldAsTheFlagThatSetsIt) {
  EXPECT_EQ(with_flag_names("`device` cuda: no CUDA GPU is visible on this machine; use `device` cpu"),
            "--device cuda: no CUDA GPU is visible on this machine; use --device cpu");
  EXPECT_EQ(with_flag_names("`dir` /x does not exist; point `dir` at a folder"),
            "--data /x does not exist; point --data at a folder");
  EXPECT_EQ(with_flag_names("`uneven_inputs` cannot be combined with `max_steps` (ranks stop)"),
            "--uneven cannot be combined with --steps (ranks stop)");
  EXPECT_EQ(with_flag_names("`nproc_per_node` 3 asks for more ranks than the 2 GPU(s) listed in `gpus` 2,7"),
            "--nproc-per-node 3 asks for more ranks than the 2 GPU(s) listed in --gpus 2,7");
}

TEST(WithFlagNames, AFieldThatANoFlagTurnsOffIsWrittenAsThatFlagOnlyWhenOff) {
  EXPECT_EQ(with_flag_names("a run with `seed` 1, `shuffle` off; resume"), "a run with --seed 1, --no-shuffle; resume");
  EXPECT_EQ(with_flag_names("`shuffle` off"), "--no-shuffle");
  EXPECT_EQ(with_flag_names("needs `shuffle`"), "needs shuffle");
}

TEST(WithFlagNames, KeepsNamesWithoutAFlagAndLeavesOtherBacktickedTextAlone) {
  EXPECT_EQ(with_flag_names("MASTER_ADDR or `init_method` tcp://HOST:PORT"),
            "MASTER_ADDR or init_method tcp://HOST:PORT");
  EXPECT_EQ(with_flag_names("`no_such_field` 3"), "no_such_field 3");
  for (const std::string untouched :
       {"put it after `--`, e.g. tandem run -- ./train", "`mpirun -np N` (or srun), not `tandem run`",
        "an unpaired ` backtick", "", "no backticks at all", "`Device` is not a field name"}) {
    EXPECT_EQ(with_flag_names(untouched), untouched);
  }
}

// Every flag in the table is one the program has: a typo would turn a clear message into a flag nobody can pass.
TEST(OptionNames, EveryFlagIsAFlagOfTheProgram) {
  std::string help;
  for (const char* command : {"train", "run"}) {
    const testing::ProcessResult result =
        testing::run_process({testing::tandem_cli(), command, "--help"}, {}, std::chrono::seconds(30));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    help += result.output;
  }
  std::set<std::string> fields;
  for (const OptionName& option : option_names()) {
    EXPECT_TRUE(fields.insert(option.field).second) << option.field << " is in the table twice";
    EXPECT_TRUE(is_option_name(option.field)) << option.field;
    if (!*option.flag) continue;
    const std::regex flag(std::string(option.flag) + "([^a-z-]|$)");
    EXPECT_TRUE(std::regex_search(help, flag)) << option.field << " -> " << option.flag << " is not in --help";
  }
}

// A C++ source's string literals, each run of adjacent ones ("a" "b") joined as the compiler joins them, with
// the line of its first. Comments and character literals are skipped; raw strings are read whole.
struct Literal {
  std::string text;
  int line = 0;
};

std::vector<Literal> string_literals(const std::string& source) {
  std::vector<Literal> literals;
  bool joinable = false;  // only whitespace and comments since the last literal ended
  int line = 1;
  auto add = [&](std::string text, int at) {
    if (joinable) {
      literals.back().text += text;
    } else {
      literals.push_back({std::move(text), at});
    }
    joinable = true;
  };
  for (size_t i = 0; i < source.size();) {
    const char c = source[i];
    if (source.compare(i, 2, "//") == 0) {
      i = source.find('\n', i);
      if (i == std::string::npos) break;
    } else if (source.compare(i, 2, "/*") == 0) {
      const size_t end = source.find("*/", i + 2);
      line += static_cast<int>(std::count(source.begin() + i, source.begin() + std::min(end, source.size()), '\n'));
      i = end == std::string::npos ? source.size() : end + 2;
    } else if (c == 'R' && source.compare(i + 1, 1, "\"") == 0 && (i == 0 || !std::isalnum(source[i - 1]))) {
      const size_t open = source.find('(', i + 2);
      const std::string close = ")" + source.substr(i + 2, open - i - 2) + "\"";
      const size_t end = source.find(close, open);
      add(source.substr(open + 1, end - open - 1), line);
      line += static_cast<int>(std::count(source.begin() + i, source.begin() + end, '\n'));
      i = end + close.size();
    } else if (c == '"') {
      std::string text;
      size_t j = i + 1;
      for (; j < source.size() && source[j] != '"'; ++j) {
        if (source[j] == '\\') text += source[j++];
        text += source[j];
      }
      add(std::move(text), line);
      i = j + 1;
    } else if (c == '\'' && (i == 0 || !std::isalnum(static_cast<unsigned char>(source[i - 1])))) {
      size_t j = i + 1;
      while (j < source.size() && source[j] != '\'') j += source[j] == '\\' ? 2 : 1;
      joinable = false;
      i = j + 1;
    } else {
      if (c == '\n') ++line;
      if (!std::isspace(static_cast<unsigned char>(c))) joinable = false;
      ++i;
    }
  }
  return literals;
}

TEST(StringLiterals, AreJoinedAndSkipCommentsAndCharacters) {
  const std::vector<Literal> found = string_literals(
      "// \"not this\"\nf('\"', \"a\" /* \"nor this\" */ \"b\");\nx = R\"x(raw \"q\")x\" + \"c\";\n");
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].text, "ab");
  EXPECT_EQ(found[0].line, 2);
  EXPECT_EQ(found[1].text, "raw \"q\"");
  EXPECT_EQ(found[1].line, 3);
  EXPECT_EQ(found[2].text, "c");  // `+` is not the compiler's joining
}

fs::path source_root() { return fs::path(TANDEM_FIXTURE_DIR).parent_path().parent_path(); }

// The library's sources (src/ and include/), each with its literals; path relative to the root.
std::vector<std::pair<std::string, std::vector<Literal>>> library_literals() {
  std::vector<std::pair<std::string, std::vector<Literal>>> files;
  for (const char* top : {"src", "include"}) {
    for (const auto& entry : fs::recursive_directory_iterator(source_root() / top)) {
      const std::string extension = entry.path().extension().string();
      if (!entry.is_regular_file() || (extension != ".cpp" && extension != ".h")) continue;
      std::ifstream in(entry.path());
      std::stringstream source;
      source << in.rdbuf();
      files.emplace_back(fs::relative(entry.path(), source_root()).string(), string_literals(source.str()));
    }
  }
  return files;
}

TEST(LibraryMessages, NameOnlyFieldsTheProgramCanWriteAsFlags) {
  const auto files = library_literals();
  ASSERT_GT(files.size(), 50u) << "the scan found too few files under " << source_root();
  const std::regex backticked("`([^`]*)`");
  int names = 0;
  for (const auto& [path, literals] : files) {
    for (const Literal& literal : literals) {
      for (std::sregex_iterator it(literal.text.begin(), literal.text.end(), backticked), end; it != end; ++it) {
        const std::string name = (*it)[1];
        if (!is_option_name(name)) continue;
        ++names;
        const OptionName* option = find_option_name(name);
        EXPECT_NE(option, nullptr) << path << ":" << literal.line << ": `" << name
                                   << "` is not in apps/option_names.h, so the program cannot name its flag";
        // A flag that turns the field off (--no-shuffle) replaces "`shuffle` off" only.
        if (option && option->flag_turns_off) {
          EXPECT_EQ(literal.text.compare(it->position() + it->length(), 4, " off"), 0)
              << path << ":" << literal.line << ": write \"`" << name << "` off\", which the program writes as "
              << option->flag;
        }
      }
    }
  }
  EXPECT_GT(names, 20) << "the scan found too few option names; is the literal reader broken?";
}

// Flags that library literals may name, each with why.
const std::set<std::pair<std::string, std::string>> kFlagsAllowed = {
    // scripts/build's flag: how to get a LibTorch with CUDA.
    {"src/util/device.cpp", "--libtorch"},
    {"src/comm/backend.cpp", "--libtorch"},
};

TEST(LibraryMessages, NameNoFlagOfTheProgram) {
  const std::regex flag("(^|[^A-Za-z0-9_-])(--[a-z][a-z0-9-]*)");
  for (const auto& [path, literals] : library_literals()) {
    for (const Literal& literal : literals) {
      for (std::sregex_iterator it(literal.text.begin(), literal.text.end(), flag), end; it != end; ++it) {
        const std::string name = (*it)[2];
        EXPECT_TRUE(kFlagsAllowed.count({path, name}))
            << path << ":" << literal.line << ": \"" << literal.text << "\" names the flag " << name
            << "; name the option's field in backticks instead (apps/option_names.h)";
      }
    }
  }
}

}  // namespace
}  // namespace tandem::app
