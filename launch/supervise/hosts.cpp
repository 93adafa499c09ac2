// Which hosts are this machine, and where the heartbeat listener binds.
#include "launch/supervise/hosts.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "core/error.h"
#include "core/host.h"

namespace moe {

namespace {

std::set<std::string> local_addresses() {
  std::set<std::string> out = {"127.0.0.1"};
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    out.insert(text);
  }
  ::freeifaddrs(list);
  return out;
}

// The IPv4 addresses `name` resolves to; empty with `why` when it does not.
std::vector<std::string> resolve(const std::string& name, std::string* why) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &found);
  std::vector<std::string> out;
  if (rc != 0) {
    *why = ::gai_strerror(rc);
    return out;
  }
  for (addrinfo* a = found; a; a = a->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof text);
    out.push_back(text);
  }
  ::freeaddrinfo(found);
  return out;
}

bool is_loopback(const std::string& address) { return address.rfind("127.", 0) == 0; }

}  // namespace

bool host_is_local(const std::string& name) {
  if (name == "localhost" || name == host_name()) return true;
  std::string why;
  const std::set<std::string> mine = local_addresses();
  for (const std::string& address : resolve(name, &why))
    if (mine.count(address) || is_loopback(address)) return true;
  return false;
}

std::string route_source_to(const std::string& host, const std::string& hostfile) {
  std::string why;
  const std::vector<std::string> addresses = resolve(host, &why);
  if (addresses.empty())
    MOE_BAD_INPUT("--hostfile " << hostfile << ": host " << host << " does not resolve to an IPv4 address (" << why
                                << "); fix the name, or /etc/hosts or DNS on this machine");
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // any port: connect() on a datagram socket sends nothing, it only picks the route
  ::inet_pton(AF_INET, addresses.front().c_str(), &to.sin_addr);
  const int sock = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) MOE_FAIL("cannot open a socket to find the route to " << host << ": " << std::strerror(errno));
  sockaddr_in from{};
  socklen_t len = sizeof from;
  const bool routed = ::connect(sock, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 &&
                      ::getsockname(sock, reinterpret_cast<sockaddr*>(&from), &len) == 0;
  const int error = errno;
  ::close(sock);
  if (!routed)
    MOE_BAD_INPUT("--hostfile " << hostfile << ": no route from this machine to host " << host << " ("
                                << addresses.front() << ": " << std::strerror(error) << ")");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &from.sin_addr, text, sizeof text);
  return text;
}

std::string choose_listen_address(const std::string& listen, const std::vector<std::string>& hosts,
                                  const std::string& hostfile) {
  std::vector<std::string> remote;
  for (const std::string& h : hosts)
    if (!host_is_local(h)) remote.push_back(h);
  if (listen != "auto") {
    if (is_loopback(listen) && !remote.empty())
      MOE_BAD_INPUT("fault.listen = \"" << listen << "\" is a loopback address, which the ranks on host "
                                        << remote.front() << " (--hostfile " << hostfile
                                        << ") cannot reach; set it to an address of this machine that every host "
                                           "reaches, or to \"auto\"");
    return listen;
  }
  if (remote.empty()) return "127.0.0.1";
  const std::string chosen = route_source_to(remote.front(), hostfile);
  for (const std::string& h : remote) {
    const std::string source = route_source_to(h, hostfile);
    if (source != chosen)
      MOE_BAD_INPUT("fault.listen = \"auto\": the hosts of --hostfile "
                    << hostfile << " are reached from different "
                    << "addresses of this machine (" << remote.front() << " from " << chosen << ", " << h << " from "
                    << source << "); set fault.listen to one "
                    << "that every host reaches");
  }
  return chosen;
}

}  // namespace moe
