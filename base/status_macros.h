// Status helpers: Debian's Abseil (20220623) has no RETURN_IF_ERROR / ASSIGN_OR_RETURN, so these are ours.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CAKE_CONCAT_INNER(a, b) a##b
#define CAKE_CONCAT(a, b) CAKE_CONCAT_INNER(a, b)

#define CAKE_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status cake_status_ = (expr);        \
    if (!cake_status_.ok()) return cake_status_; \
  } while (0)

#define CAKE_ASSIGN_OR_RETURN(lhs, expr) CAKE_ASSIGN_OR_RETURN_IMPL(CAKE_CONCAT(cake_statusor_, __LINE__), lhs, expr)

#define CAKE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
