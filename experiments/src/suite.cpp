// Suite files: parsing, axis expansion, case names (see suite.h).
#include "suite.h"

#include <fstream>
#include <map>
#include <set>

#include "hybridtb/error.h"
#include "hybridtb/mix.h"
#include "hybridtb/presets.h"
#include "hybridtb/shell.h"

namespace hybridtb::bench {

namespace {

// The axes every case name carries, in the order gen applies them: ssm_mode first because
// switching the mode drops the ssm.* parameters set before it (extra settings come after).
const std::vector<std::string> kAxes = {"ssm_mode", "sliding_window", "dtype", "kv_cache_dtype"};

// A scalar or a list of scalars → strings (numbers written as integers).
std::vector<std::string> string_list(const nlohmann::json& value, const std::string& where) {
  std::vector<std::string> out;
  auto one = [&](const nlohmann::json& v) {
    if (v.is_string()) {
      out.push_back(v.get<std::string>());
    } else if (v.is_number_integer()) {
      out.push_back(std::to_string(v.get<int64_t>()));
    } else {
      throw Error(where + ": expected a string or an integer, got " + v.dump());
    }
  };
  if (value.is_array()) {
    for (const auto& v : value) one(v);
  } else {
    one(value);
  }
  if (out.empty()) throw Error(where + ": empty list");
  return out;
}

// The canonical value of an axis in a finished layer.
std::string axis_value(const Layer& layer, const std::string& axis) {
  if (axis == "ssm_mode") return layer.attention.ssm_mode;
  if (axis == "sliding_window") return std::to_string(layer.attention.sliding_window);
  if (axis == "dtype") return std::string(to_string(layer.attention.dtype));
  return std::string(to_string(layer.attention.kv_cache_dtype));
}

}  // namespace

std::string case_name(const std::string& preset, const std::string& mix, const std::vector<std::string>& settings) {
  std::string name = preset + "/" + mix;
  for (const std::string& s : settings) name += "/" + s;
  return name;
}

// The bench builds its layers without an engine version (make_layer's default), so the command names
// --engine-version none: `hybridtb gen` would otherwise apply the newest release's rules.
std::string SuiteCase::gen_command(const std::string& out) const {
  std::string command = "hybridtb gen --preset " + preset + " --mix " + shell_word(mix) + " --seed " + std::to_string(seed) +
                        " --engine-version none";
  for (const std::string& s : settings) command += " --set " + shell_word(s);
  return command + " --out " + shell_word(out);
}

std::string SuiteCase::parity_command(const std::string& file, const std::string& backend) {
  return "hybridtb parity --backend " + backend + " --against reference " + shell_word(file);
}

Suite parse_suite(const nlohmann::json& json, const std::string& path) {
  const std::string where = path.empty() ? std::string("suite") : path;
  HYBRIDTB_CHECK(json.is_object() && json.value("schema", "") == "hybridtb-bench-suite", where,
                 ": expected a JSON object with schema \"hybridtb-bench-suite\"");
  HYBRIDTB_CHECK(json.value("version", 0) == 1, where, ": unsupported suite version ", json.value("version", 0));
  Suite suite;
  suite.path = path;
  suite.name = json.value("name", "unnamed");
  suite.description = json.value("description", "");
  const nlohmann::json defaults = json.value("defaults", nlohmann::json::object());
  suite.reference_max_gflop = defaults.value("reference_max_gflop", 10.0);
  suite.reference_repetitions = defaults.value("reference_repetitions", 3);
  HYBRIDTB_CHECK(json.contains("groups") && json["groups"].is_array(), where, ": 'groups' must be a list");
  std::set<std::string> seen;
  for (const nlohmann::json& group : json["groups"]) {
    const std::string gname = group.value("name", "group");
    const std::string gwhere = where + ": group '" + gname + "'";
    HYBRIDTB_CHECK(group.contains("preset") && group.contains("mix"), gwhere, ": needs 'preset' and 'mix'");
    std::vector<std::string> extras;
    if (group.contains("set")) extras = string_list(group["set"], gwhere + " set");
    for (const std::string& e : extras) {
      const std::string key = e.substr(0, e.find('='));
      for (const std::string& axis : kAxes) {
        HYBRIDTB_CHECK(key != axis, gwhere, ": '", e, "' sets an axis: use the group's '", axis, "' field");
      }
    }
    const std::vector<std::string> backends =
        string_list(group.value("backends", defaults.value("backends", nlohmann::json::array({"reference"}))),
                    gwhere + " backends");
    const int repetitions = group.value("repetitions", defaults.value("repetitions", 5));
    const double min_time = group.value("min_time_s", defaults.value("min_time_s", 0.05));
    const auto seed = group.value("seed", defaults.value("seed", uint64_t{0}));
    HYBRIDTB_CHECK(repetitions >= 1 && min_time > 0, gwhere, ": repetitions must be >= 1 and min_time_s > 0");

    for (const std::string& preset : string_list(group["preset"], gwhere + " preset")) {
      const Layer preset_layer = make_layer(preset, extras);
      // Each axis: the group's values, or the preset's own.
      std::vector<std::vector<std::string>> axis_values;
      for (const std::string& axis : kAxes) {
        axis_values.push_back(group.contains(axis) ? string_list(group[axis], gwhere + " " + axis)
                                                   : std::vector<std::string>{axis_value(preset_layer, axis)});
      }
      for (const std::string& mix_text : string_list(group["mix"], gwhere + " mix")) {
        const std::string mix = to_string(parse_mix(mix_text));
        // Cartesian product of the axes (odometer over axis_values).
        std::vector<size_t> index(kAxes.size(), 0);
        while (true) {
          std::vector<std::string> settings;
          for (size_t a = 0; a < kAxes.size(); ++a) settings.push_back(kAxes[a] + "=" + axis_values[a][index[a]]);
          settings.insert(settings.end(), extras.begin(), extras.end());
          Layer layer;
          try {
            layer = make_layer(preset, settings);
          } catch (const Error& e) {
            throw Error(gwhere + ": preset " + preset + ", mix " + mix + ": " + e.what());
          }
          // Canonical axis strings (e.g. kv "fp8" → "fp8_e4m3"), so names are unique and stable.
          for (size_t a = 0; a < kAxes.size(); ++a) settings[a] = kAxes[a] + "=" + axis_value(layer, kAxes[a]);
          SuiteCase c;
          c.name = case_name(preset, mix, settings);
          c.group = gname;
          c.preset = preset;
          c.mix = mix;
          c.settings = settings;
          c.seed = seed;
          c.backends = backends;
          c.repetitions = repetitions;
          c.min_time_s = min_time;
          const bool hybrid = layer.attention.has_ssm_branch();
          c.paths = hybrid ? std::vector<std::string>{"fused", "two_kernel"} : std::vector<std::string>{"fused"};
          if (group.contains("paths")) {
            c.paths = string_list(group["paths"], gwhere + " paths");
            for (const std::string& p : c.paths) {
              HYBRIDTB_CHECK(p == "fused" || p == "graph" || (p == "two_kernel" && hybrid), gwhere, ": path '", p,
                             "' (fused, graph, or two_kernel for a layer with an SSM branch)");
            }
          }
          HYBRIDTB_CHECK(seen.insert(c.name).second, gwhere, ": case ", c.name, " is listed twice");
          suite.cases.push_back(std::move(c));
          size_t a = 0;
          while (a < kAxes.size() && ++index[a] == axis_values[a].size()) index[a++] = 0;
          if (a == kAxes.size()) break;
        }
      }
    }
  }
  return suite;
}

Suite load_suite(const std::string& path) {
  std::ifstream in(path);
  HYBRIDTB_CHECK(in.good(), "cannot open suite file ", path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  return parse_suite(json, path);
}

std::string short_bench_name(const std::string& bench_name, size_t width) {
  static const std::map<std::string, std::string> kDtypes = {
      {"bfloat16", "bf16"}, {"float16", "fp16"}, {"float32", "fp32"}};
  std::vector<std::string> axes;    // backend, path, preset, mix and the suite's axes
  std::vector<std::string> extras;  // the other `--set` settings of the case's group
  size_t begin = 0;
  for (int index = 0; begin <= bench_name.size(); ++index) {
    size_t end = bench_name.find('/', begin);
    if (end == std::string::npos) end = bench_name.size();
    std::string seg = bench_name.substr(begin, end - begin);
    begin = end + 1;
    if (index == 0 && seg == "reference") seg = "ref";
    const size_t eq = seg.find('=');
    bool extra = false;
    if (index >= 2 && eq != std::string::npos) {
      const std::string key = seg.substr(0, eq), value = seg.substr(eq + 1);
      if ((key == "ssm_mode" && value == "none") || (key == "sliding_window" && value == "0") ||
          (key == "kv_cache_dtype" && value == "auto") || (key == "dtype" && value == "bfloat16")) {
        continue;
      }
      if (key == "ssm_mode") {
        seg = "ssm=" + value;
      } else if (key == "sliding_window") {
        seg = "w=" + value;
      } else if (key == "dtype") {
        seg = kDtypes.count(value) ? kDtypes.at(value) : value;
      } else if (key == "kv_cache_dtype") {
        static const std::map<std::string, std::string> kKv = {{"fp8_e4m3", "e4m3"}, {"fp8_e5m2", "e5m2"},
                                                               {"fp8_per_token_head", "fp8-tok"},
                                                               {"int8_per_token_head", "int8-tok"}};
        seg = "kv=" + (kKv.count(value) ? kKv.at(value) : value);
      } else {
        extra = true;
      }
    }
    if (!seg.empty()) (extra ? extras : axes).push_back(seg);
  }
  const auto join = [](const std::vector<std::string>& parts) {
    std::string out;
    for (const std::string& part : parts) out += (out.empty() ? "" : " ") + part;
    return out;
  };
  std::vector<std::string> all = axes;
  all.insert(all.end(), extras.begin(), extras.end());
  std::string out = join(all);
  // Too wide: the group's extra settings (the same for every case of a group, so they rarely tell
  // two rows apart) give way first, from the last, counted as "+N set"; then the middle.
  for (size_t keep = extras.size(); out.size() > width && keep-- > 0;) {
    all = axes;
    all.insert(all.end(), extras.begin(), extras.begin() + static_cast<std::ptrdiff_t>(keep));
    all.push_back("+" + std::to_string(extras.size() - keep) + " set");
    out = join(all);
  }
  if (out.size() <= width || width < 8) return out;
  const size_t tail = (width - 2) / 3, head = width - 2 - tail;
  return out.substr(0, head) + ".." + out.substr(out.size() - tail);
}

}  // namespace hybridtb::bench
