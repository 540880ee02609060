// Errors as values: an error keeps its message and where it was raised.

#include "parax/runtime/Status.h"

#include <gtest/gtest.h>

using parax::runtime::Status;
using parax::runtime::StatusOr;

TEST(Status, DefaultIsOk) {
  Status status;
  EXPECT_TRUE(status.isOk());
  EXPECT_EQ(status.toString(), "ok");
}

TEST(Status, ErrorNamesFileAndLine) {
  Status status = PARAX_ERROR("buffer 3 has a negative size");
  int line = __LINE__ - 1;
  ASSERT_FALSE(status.isOk());
  EXPECT_EQ(status.message(), "buffer 3 has a negative size");
  EXPECT_EQ(status.toString(), "StatusTest.cpp:" + std::to_string(line) +
                                   ": buffer 3 has a negative size");
}

TEST(Status, StatusOrCarriesValueOrError) {
  StatusOr<int> good(42);
  ASSERT_TRUE(good.isOk());
  EXPECT_EQ(good.value(), 42);
  StatusOr<int> bad(PARAX_ERROR("no such tensor"));
  EXPECT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(), "no such tensor");
}
