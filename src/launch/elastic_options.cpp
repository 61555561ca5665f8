#include "tandem/launch/elastic_options.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

// Nodes in one elastic job: far more than any cluster a TCPStore serves.
constexpr int kMaxElasticNodes = 100000;
// The longest any rendezvous timing may be: a day.
constexpr double kMaxConfSeconds = 24 * 3600;

bool read_whole(const std::string& text, long min, long max, int& value) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 9) return false;
  const long parsed = std::strtol(text.c_str(), nullptr, 10);
  if (parsed < min || parsed > max) return false;
  value = static_cast<int>(parsed);
  return true;
}

bool read_seconds(const std::string& text, double min, std::chrono::milliseconds& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(seconds) || seconds < min ||
      seconds > kMaxConfSeconds) {
    return false;
  }
  value = std::chrono::milliseconds(std::llround(seconds * 1000));
  return true;
}

}  // namespace

void parse_node_range(const std::string& text, int& min_nodes, int& max_nodes) {
  const size_t colon = text.find(':');
  const std::string low = text.substr(0, colon);
  const std::string high = colon == std::string::npos ? low : text.substr(colon + 1);
  if (!read_whole(low, 1, kMaxElasticNodes, min_nodes) || !read_whole(high, 1, kMaxElasticNodes, max_nodes)) {
    throw InvalidArgument(fmt::format(
        "`nnodes` '{}' is not a number of nodes: give N or MIN:MAX, each from 1 to {}", text, kMaxElasticNodes));
  }
  if (min_nodes > max_nodes) {
    throw InvalidArgument(fmt::format("`nnodes` {}: the least number of nodes is above the most; give MIN:MAX with "
                                      "MIN <= MAX, e.g. {}:{}",
                                      text, max_nodes, min_nodes));
  }
}

void parse_rendezvous_endpoint(const std::string& text, ElasticSettings& settings) {
  const auto refuse = [&](const std::string& why) {
    return InvalidArgument(fmt::format("`rdzv_endpoint` '{}' {}; give HOST:PORT, e.g. node0.cluster:29400", text, why));
  };
  std::string host = text;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) throw refuse("opens an IPv6 address with '[' but never closes it");
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') throw refuse("has text after the IPv6 address that is not :PORT");
      port = text.substr(close + 2);
      if (port.empty()) throw refuse("ends in ':' without a port");
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != std::string::npos) {
      if (text.find(':') != colon) throw refuse("has more than one ':' (write an IPv6 address as [ADDRESS]:PORT)");
      host = text.substr(0, colon);
      port = text.substr(colon + 1);
      if (port.empty()) throw refuse("ends in ':' without a port");
    }
  }
  if (host.empty()) throw refuse("names no host");
  int number = kDefaultRendezvousPort;
  if (!port.empty() && !read_whole(port, 1, 65535, number)) throw refuse(fmt::format("has port '{}', not 1..65535", port));
  settings.host = host;
  settings.port = number;
}

void parse_rendezvous_conf(const std::string& text, ElasticSettings& settings) {
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t comma = text.find(',', start);
    const std::string entry = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t equals = entry.find('=');
    const std::string key = entry.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : entry.substr(equals + 1);
    bool read = equals != std::string::npos;
    std::string wanted;
    if (key == "join_timeout") {
      read = read && read_seconds(value, 0.001, settings.join_timeout);
      wanted = "seconds above 0";
    } else if (key == "last_call_timeout") {
      read = read && read_seconds(value, 0, settings.last_call);
      wanted = "seconds, 0 or more";
    } else if (key == "keep_alive_interval") {
      read = read && read_seconds(value, 0.01, settings.keep_alive_interval);
      wanted = "seconds, at least 0.01";
    } else if (key == "keep_alive_max_attempt") {
      // At least 2: a node cut off from the store gives up on it when no heartbeat was answered for interval x
      // attempts (heartbeat_watch.h), and with 1 the next heartbeat would be due the moment it must give up.
      read = read && read_whole(value, 2, 1000, settings.keep_alive_max_attempt);
      wanted = "a whole number from 2 to 1000";
    } else {
      throw InvalidArgument(fmt::format("`rdzv_conf` '{}': unknown key '{}'; the keys are join_timeout, "
                                        "last_call_timeout, keep_alive_interval and keep_alive_max_attempt, "
                                        "written key=value,key=value",
                                        text, key));
    }
    if (!read) {
      throw InvalidArgument(fmt::format("`rdzv_conf` '{}': '{}' needs {}, written {}=VALUE", text, entry, wanted, key));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

}  // namespace tandem::launch
