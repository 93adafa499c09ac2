// The hosts of `moe launch --hostfile`: which of them are this machine, and the address the supervisor's
// heartbeat listener binds to so that the ranks on every host reach it (fault.listen). Not here: reading the
// hostfile (launch/supervise/supervisor.h) or probing the hosts (launch/supervise/host_probe.h).
#pragma once

#include <string>
#include <vector>

namespace moe {

// True when `name` is this machine: "localhost", this host's name, or a name that resolves to an address of one
// of this machine's interfaces (loopback included).
bool host_is_local(const std::string& name);

// The IPv4 address of this machine that packets to `host` leave from (the route's source address): a UDP socket
// connected to it, asked for its own address; nothing is sent. BadInput naming the hostfile and the host when it
// does not resolve or no route leads to it.
std::string route_source_to(const std::string& host, const std::string& hostfile);

// The address for the heartbeat listener. `listen` is fault.listen: "auto" chooses loopback when every host of
// `hosts` is this machine (or there are none), else the source address of the route to the remote hosts (BadInput
// when they are reached from different addresses, asking for fault.listen); an explicit loopback address with a
// remote host is BadInput naming fault.listen, since no remote rank could reach it. Anything else is returned
// as given (binding it is the caller's check).
std::string choose_listen_address(const std::string& listen, const std::vector<std::string>& hosts,
                                  const std::string& hostfile);

}  // namespace moe
