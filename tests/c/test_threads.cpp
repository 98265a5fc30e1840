// test_threads.cpp -- the C API from several threads at once: threads running different
// entries of one frame while another thread compiles more entries into it, threads sharing one
// entry, and side exits taken on several threads (each thread hands over its own exit). Every
// result is checked. Public header only.
#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "helpers.h"
}

namespace {

std::string scale_trace(int k) {
  return "trace @t" + std::to_string(k) + " {\n  %0 = input f32[257]\n  %1 = mul(%0, " + std::to_string(k + 1) +
         ".0)\n  %2 = add(%1, 1.0)\n  return %2\n}\n";
}

dynamo_entry *compile(dynamo_frame *f, const std::string &text) {
  dynamo_trace *t = nullptr;
  if (dynamo_trace_parse(text.c_str(), text.size(), &t) != DYNAMO_OK) return nullptr;
  dynamo_entry *e = nullptr;
  dynamo_status s = dynamo_compile_frame(f, t, &e);
  dynamo_trace_destroy(t);
  return s == DYNAMO_OK ? e : nullptr;
}

void test_run_while_compiling(void **) {
  dynamo_frame *f = nullptr;
  assert_int_equal(dynamo_frame_create(g_engine, "threads", &f), DYNAMO_OK);
  const int kRunners = 4;
  std::vector<dynamo_entry *> entries;
  for (int k = 0; k < kRunners; ++k) entries.push_back(compile(f, scale_trace(k)));
  for (dynamo_entry *e : entries) assert_non_null(e);
  std::atomic<int> bad{0}, compiled{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kRunners; ++k)
    threads.emplace_back([&, k] {
      std::vector<float> x(257), y(257);
      int64_t shape[1] = {257};
      test_tensor tx, ty;
      tt_init(&tx, x.data(), kDLFloat, 32, 1, shape, nullptr);
      tt_init(&ty, y.data(), kDLFloat, 32, 1, shape, nullptr);
      dynamo_arg a = arg_tensor(&tx);
      for (int it = 0; it < 2000; ++it) {
        for (int i = 0; i < 257; ++i) x[i] = (float)(i + it);
        if (dynamo_entry_run(entries[k], &a, 1, &ty.dl, 1) != DYNAMO_OK) ++bad;
        for (int i = 0; i < 257; i += 64)
          if (y[i] != x[i] * (float)(k + 1) + 1.0f) ++bad;
      }
    });
  threads.emplace_back([&] {  // meanwhile: more entries for the same frame
    for (int k = kRunners; k < kRunners + 12; ++k)
      if (compile(f, scale_trace(k))) ++compiled;
  });
  for (std::thread &t : threads) t.join();
  assert_int_equal(bad.load(), 0);
  assert_int_equal(compiled.load(), 12);
  assert_int_equal(dynamo_frame_num_entries(f), kRunners + 12);
  assert_int_equal(dynamo_frame_destroy(f), DYNAMO_OK);
}

const char *kBranch =
    "trace @branch {\n  %0 = input f32[16]\n  %1 = sum(%0, [], false) : f32[]\n  %2 = gt(%1, 0.0) : bool[]\n"
    "  %3 = extern dynamo::guard(%2, true, 0, %1) : bool[]\n  %4 = mul(%0, 2.0) : f32[16]\n  return %4\n}\n";

void test_side_exits_on_many_threads(void **) {
  dynamo_frame *f = nullptr;
  assert_int_equal(dynamo_frame_create(g_engine, "exits", &f), DYNAMO_OK);
  dynamo_entry *e = compile(f, kBranch);
  assert_non_null(e);
  std::atomic<int> bad{0}, exits{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      float x[16], y[16];
      int64_t shape[1] = {16};
      test_tensor tx, ty;
      tt_init(&tx, x, kDLFloat, 32, 1, shape, nullptr);
      tt_init(&ty, y, kDLFloat, 32, 1, shape, nullptr);
      dynamo_arg a = arg_tensor(&tx);
      for (int it = 0; it < 1000; ++it) {
        float sign = ((it + k) % 2) ? 1.0f : -1.0f, v = sign * (float)(k + 1);
        for (int i = 0; i < 16; ++i) x[i] = v;
        dynamo_status s = dynamo_entry_run(e, &a, 1, &ty.dl, 1);
        if (sign > 0) {
          if (s != DYNAMO_OK || y[5] != 2.0f * v) ++bad;
          continue;
        }
        int32_t id = -1;
        size_t n = 0;
        DLManagedTensor *val = nullptr;
        if (s != DYNAMO_EXIT || dynamo_take_exit(&id, &val, 1, &n) != DYNAMO_OK || id != 0 || n != 1) {
          ++bad;
          continue;
        }
        if (*(const float *)val->dl_tensor.data != 16.0f * v) ++bad;  // this thread's own sum
        val->deleter(val);
        ++exits;
      }
    });
  for (std::thread &t : threads) t.join();
  assert_int_equal(bad.load(), 0);
  assert_int_equal(exits.load(), 2000);
  assert_int_equal(dynamo_entry_exit_count(e, 0), 2000);
  assert_int_equal(dynamo_frame_destroy(f), DYNAMO_OK);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_run_while_compiling),
      cmocka_unit_test(test_side_exits_on_many_threads),
  };
  return cmocka_run_group_tests_name("threads", tests, group_setup, group_teardown);
}
