// What the config schema's two files share, private to launch/: the limits of the code itself, which the key
// table states as ranges (launch/config/config_schema.cpp) and the check of one value repeats inside the lists it
// walks (launch/config/config_schema_values.cpp).
#pragma once

namespace moe::config_schema::detail {

// Limits of the code itself, each with its reason in the key's doc.
constexpr double kMaxSteps = 99999999;  // checkpoint folders are step-%08d, newest found by name
constexpr double kMaxInt32 = 2147483647;
constexpr double kMaxExperts = 1024;  // the router's per-token score buffer (core/moe_router.cpp)

}  // namespace moe::config_schema::detail
