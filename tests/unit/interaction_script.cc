#include "interaction_script.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tessera::testing {
namespace {

constexpr const char* kSeparator = "----";

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string JoinLines(const std::vector<std::string>& lines, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) out += (i > begin ? "\n" : "") + lines[i];
  return out;
}

bool IsBlank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

// Each output line indented, for a failure message.
std::string Indented(const std::string& text) {
  if (text.empty()) return "    (nothing)\n";
  std::string out;
  for (const std::string& line : SplitLines(text)) out += "    " + line + "\n";
  return out;
}

// A block: the command's line and the range of lines of its expected output.
struct Block {
  size_t command = 0;
  size_t out_begin = 0;
  size_t out_end = 0;
};

Result<std::vector<Block>> FindBlocks(const std::vector<std::string>& lines) {
  std::vector<Block> blocks;
  size_t i = 0;
  while (i < lines.size()) {
    if (IsBlank(lines[i]) || lines[i].starts_with("#")) {
      ++i;
      continue;
    }
    if (i + 1 >= lines.size() || lines[i + 1] != kSeparator) {
      return InvalidArgument("command '" + lines[i] + "' is not followed by a line '----'",
                             {{"line", i + 1}});
    }
    Block b{i, i + 2, i + 2};
    while (b.out_end < lines.size() && !IsBlank(lines[b.out_end])) ++b.out_end;
    blocks.push_back(b);
    i = b.out_end;
  }
  return blocks;
}

}  // namespace

Result<ScriptCommand> ScriptCommand::Parse(const std::string& text) {
  ScriptCommand c;
  size_t pos = text.find_first_not_of(' ');
  size_t end = text.find(' ', pos);
  c.name_ = text.substr(pos, end == std::string::npos ? end : end - pos);
  pos = end;
  while ((pos = text.find_first_not_of(' ', pos)) != std::string::npos) {
    const size_t eq = text.find('=', pos);
    const size_t space = text.find(' ', pos);
    if (eq == std::string::npos || (space != std::string::npos && space < eq) || eq == pos) {
      return InvalidArgument("'" +
                             text.substr(pos, space == std::string::npos ? space : space - pos) +
                             "' is not key=value");
    }
    const std::string key = text.substr(pos, eq - pos);
    std::string value;
    pos = eq + 1;
    if (pos < text.size() && (text[pos] == '"' || text[pos] == '\'')) {
      const char quote = text[pos++];
      bool closed = false;
      while (pos < text.size() && !closed) {
        const char ch = text[pos++];
        if (ch == quote) {
          closed = true;
        } else if (quote == '"' && ch == '\\' && pos < text.size()) {
          value += text[pos++];
        } else {
          value += ch;
        }
      }
      if (!closed) return InvalidArgument("the value of '" + key + "' has no closing quote");
      if (pos < text.size() && text[pos] != ' ') {
        return InvalidArgument("the quoted value of '" + key + "' runs on after its quote");
      }
    } else {
      end = text.find(' ', pos);
      value = text.substr(pos, end == std::string::npos ? end : end - pos);
      pos = end;
    }
    if (!c.args_.emplace(key, value).second) {
      return InvalidArgument("argument '" + key + "' is given twice");
    }
  }
  return c;
}

Status ScriptCommand::Bad(const std::string& key, const std::string& what) const {
  return InvalidArgument("argument '" + key + "' of " + name_ + " " + what);
}

std::optional<std::string> ScriptCommand::Get(const std::string& key) {
  auto it = args_.find(key);
  if (it == args_.end()) return std::nullopt;
  used_.insert(key);
  return it->second;
}

Result<std::string> ScriptCommand::String(const std::string& key) {
  auto v = Get(key);
  if (!v) return Bad(key, "is required");
  return *v;
}

std::string ScriptCommand::String(const std::string& key, const std::string& fallback) {
  return Get(key).value_or(fallback);
}

Result<int64_t> ScriptCommand::Int(const std::string& key) {
  ASSIGN_OR_RETURN(std::string v, String(key));
  int64_t n = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || ptr != v.data() + v.size()) return Bad(key, "is not an integer: " + v);
  return n;
}

Result<int64_t> ScriptCommand::Int(const std::string& key, int64_t fallback) {
  if (!Has(key)) return fallback;
  return Int(key);
}

Result<bool> ScriptCommand::Bool(const std::string& key, bool fallback) {
  auto v = Get(key);
  if (!v) return fallback;
  if (*v == "true") return true;
  if (*v == "false") return false;
  return Bad(key, "is neither true nor false: " + *v);
}

Result<std::vector<int64_t>> ScriptCommand::Ints(const std::string& key,
                                                 std::vector<int64_t> fallback) {
  auto v = Get(key);
  if (!v) return fallback;
  std::vector<int64_t> out;
  std::istringstream in(*v);
  for (std::string part; std::getline(in, part, ',');) {
    int64_t n = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), n);
    if (ec != std::errc() || ptr != part.data() + part.size() || part.empty()) {
      return Bad(key, "is not a list of integers such as 0,1: " + *v);
    }
    out.push_back(n);
  }
  return out;
}

Status ScriptCommand::CheckAllUsed() const {
  for (const auto& [key, value] : args_) {
    if (!used_.count(key)) return InvalidArgument(name_ + " takes no argument '" + key + "'");
  }
  return Status::Ok();
}

ScriptReport RunScript(const std::string& path, const ScriptRunner& run, bool rewrite) {
  ScriptReport report;
  std::ifstream in(path);
  if (!in) {
    report.failures.push_back({path, 0, "cannot be read"});
    return report;
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<std::string> lines = SplitLines(text.str());
  auto blocks = FindBlocks(lines);
  if (!blocks.ok()) {
    report.failures.push_back(
        {path, blocks.status().details().value("line", 0), blocks.status().message()});
    return report;
  }
  std::vector<std::string> rewritten;
  size_t copied = 0;
  for (const Block& b : *blocks) {
    const int where = static_cast<int>(b.command) + 1;
    const std::string& line = lines[b.command];
    auto command = ScriptCommand::Parse(line);
    Result<std::string> got = command.ok() ? run(*command) : Result<std::string>(command.status());
    if (!got.ok()) {
      report.failures.push_back(
          {path, where, line + "\n  the script is wrong: " + got.status().message()});
      return report;
    }
    std::string output = *got;
    while (output.ends_with("\n")) output.pop_back();
    const std::vector<std::string> out_lines = SplitLines(output);
    if (std::any_of(out_lines.begin(), out_lines.end(), IsBlank)) {
      report.failures.push_back(
          {path, where, line + "\n  its output holds a blank line:\n" + Indented(output)});
      return report;
    }
    ++report.blocks;
    const std::string expected = JoinLines(lines, b.out_begin, b.out_end);
    if (output != expected && !rewrite) {
      report.failures.push_back(
          {path, where,
           line + "\n  expected:\n" + Indented(expected) + "  got:\n" + Indented(output)});
    }
    rewritten.insert(rewritten.end(), lines.begin() + copied, lines.begin() + b.out_begin);
    rewritten.insert(rewritten.end(), out_lines.begin(), out_lines.end());
    copied = b.out_end;
  }
  if (!rewrite) return report;
  rewritten.insert(rewritten.end(), lines.begin() + copied, lines.end());
  if (rewritten == lines) return report;
  std::ofstream out(path, std::ios::trunc);
  out << JoinLines(rewritten, 0, rewritten.size()) << "\n";
  if (!out.flush()) {
    report.failures.push_back({path, 0, "cannot be rewritten"});
    return report;
  }
  report.rewritten = true;
  return report;
}

std::vector<std::string> ScriptFiles(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool RewriteRequested() {
  const char* v = std::getenv("TESSERA_REWRITE");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace tessera::testing
