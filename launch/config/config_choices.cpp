// The failures of launch/config/config_choices.h's look-ups: a program error either way, since every name looked up
// passed the schema, which allows exactly the table's names.
#include "launch/config/config_choices.h"

#include "core/error.h"

namespace moe {

void unnamed_choice(int value) { MOE_FAIL("config choice value " << value << " has no name"); }

void unknown_choice(std::string_view name) {
  MOE_FAIL("config choice \"" << name << "\" has no value (the schema allows only the table's names)");
}

}  // namespace moe
