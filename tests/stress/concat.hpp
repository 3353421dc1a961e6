// Builds failure messages by appending pieces. (Writing `"literal" + std::string` trips GCC 12's
// false -Wrestrict warning at -O3, which --werror turns into a build failure.)
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

namespace vramledger::stress {

template <typename... Pieces>
std::string concat(const Pieces&... pieces) {
  std::string text;
  auto append = [&text](const auto& piece) {
    using Piece = std::decay_t<decltype(piece)>;
    if constexpr (std::is_arithmetic_v<Piece>) {
      text += std::to_string(piece);
    } else {
      text += std::string_view(piece);
    }
  };
  (append(pieces), ...);
  return text;
}

}  // namespace vramledger::stress
