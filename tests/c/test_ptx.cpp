// test_ptx.cpp -- PTX without a GPU: every pointwise op (float32 and float64), the reductions
// the GPU backend must cover (softmax, layer norm, sum/mean/amax over the last dim, whole-tensor
// sum/var), half types and a split reduction are lowered through LLVM's NVPTX backend and
// assembled with `ptxas --gpu-name sm_90` (skipped, saying so, when ptxas is absent); extern ops
// other than matrix products (cuBLASLt calls, not PTX) and bad GPU names are refused; without a driver, dynamo_gpu_available says
// DYNAMO_ERR_NO_DEVICE with a reason. Nothing here needs a GPU.
#include <string>
#include <vector>

#include "gpu_block_traces.h"

#include <unistd.h>

extern "C" {
#include "helpers.h"
}

namespace {

std::string g_ptxas;  // empty: not installed

struct OpCase {
  const char *name;
  int arity;
};
const OpCase kPointwise[] = {
#define X(name, kind, arity, rule) {#name, (OpKind_##kind == 1) ? arity : -1},
#define OpKind_INPUT 0
#define OpKind_EXTERN 0
#define OpKind_POINTWISE 1
#define OpKind_REDUCTION 0
#define OpKind_VIEW 0
#define OpKind_GATHER 0
#include "ops.def"
#undef X
};

std::string body_for(const std::string &op, const char *ty) {
  std::string t = std::string(ty) + "[1023]";
  if (op == "clamp") return "  %2 = clamp(%0, -1.0, 1.0) : " + t + "\n";
  if (op == "where") return "  %c = gt(%0, 0.0) : bool[1023]\n  %2 = where(%c, %0, %1) : " + t + "\n";
  if (op == "to") return "  %2 = to(%0, i32) : i32[1023]\n";
  if (op == "leaky_relu") return "  %2 = leaky_relu(%0, 0.1) : " + t + "\n";
  if (op == "softplus") return "  %2 = softplus(%0, 1.0, 20.0) : " + t + "\n";
  if (op == "pow") return "  %2 = pow(%0, %1)\n";
  if (op == "logical_not") return "  %2 = logical_not(%0)\n";
  return "";
}

bool assembles(const std::string &ptx, std::string *log) {
  char path[] = "/tmp/dynamo_ptx_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return false;
  FILE *f = fdopen(fd, "w");
  fwrite(ptx.data(), 1, ptx.size(), f);
  fclose(f);
  std::string cmd = g_ptxas + " --gpu-name sm_90 " + path + " -o /dev/null 2>&1";
  FILE *p = popen(cmd.c_str(), "r");
  char buf[512];
  while (p && fgets(buf, sizeof buf, p)) *log += buf;
  int rc = p ? pclose(p) : -1;
  unlink(path);
  return rc == 0;
}

std::string to_ptx(const std::string &text, dynamo_status *st) {
  dynamo_trace *t = nullptr;
  *st = dynamo_trace_parse(text.c_str(), text.size(), &t);
  if (*st != DYNAMO_OK) return "";
  char *ptx = nullptr;
  *st = dynamo_trace_to_ptx(t, "sm_90", &ptx);
  dynamo_trace_destroy(t);
  std::string s = ptx ? ptx : "";
  dynamo_string_free(ptx);
  return s;
}

void check_trace(const std::string &text) {
  dynamo_status st;
  std::string ptx = to_ptx(text, &st);
  if (st != DYNAMO_OK) fail_msg("lowering failed: %s\n%s", dynamo_last_error(), text.c_str());
  assert_true(ptx.find(".entry") != std::string::npos);
  if (g_ptxas.empty()) return;
  std::string log;
  if (!assembles(ptx, &log)) fail_msg("ptxas rejected the PTX of\n%s\n%s", text.c_str(), log.c_str());
}

void test_every_pointwise_op(void **) {
  int n = 0;
  for (const char *ty : {"f32", "f64"})
    for (const OpCase &c : kPointwise) {
      std::string op = c.name;
      if (c.arity < 0 || op == "copy_") continue;
      std::string body = body_for(op, ty);
      if (body.empty()) body = c.arity == 1 ? "  %2 = " + op + "(%0)\n" : "  %2 = " + op + "(%0, %1)\n";
      std::string t = std::string(ty) + "[1023]";
      check_trace("trace @op_" + op + " {\n  %0 = input " + t + "\n  %1 = input " + t + "\n" + body +
                  "  return %2\n}\n");
      ++n;
    }
  print_message("ptx: %d pointwise traces lowered%s\n", n, g_ptxas.empty() ? "" : " and assembled by ptxas");
}

void test_reductions_and_norms(void **) {
  const char *traces[] = {
      "trace @softmax {\n  %0 = input f32[64,1000]\n"
      "  %1 = extern aten::_softmax(%0, 1, false) : f32[64,1000]\n  return %1\n}\n",
      "trace @layer_norm {\n  %0 = input f32[64,1024]\n  %1 = input f32[1024]\n  %2 = input f32[1024]\n"
      "  %3 = extern aten::layer_norm(%0, [1024], %1, %2, 1e-05, false) : f32[64,1024]\n  return %3\n}\n",
      "trace @rows {\n  %0 = input f32[33,17]\n  %1 = sum(%0, [1], false)\n  %2 = mean(%0, [1], true)\n"
      "  %3 = amax(%0, [1], false)\n  return %1, %2, %3\n}\n",
      "trace @full {\n  %0 = input f32[1048576]\n  %1 = sum(%0, [], false)\n  %2 = var(%0, [], 1, false)\n"
      "  return %1, %2\n}\n",
      "trace @half {\n  %0 = input f16[7,33]\n  %1 = input bf16[33]\n  %2 = add(%0, %1)\n"
      "  %3 = amax(%2, [1], true)\n  %4 = argmax(%2, 1, false)\n  return %3, %4\n}\n",
      "trace @views {\n  %0 = input f32[16,9]{1,16}\n  %1 = transpose(%0, 0, 1)\n  %2 = exp(%1)\n"
      "  %3 = floordiv(%2, 3.0)\n  return %3\n}\n",
      // Pointwise kernels in unrolled tiles (f64, f16 and a broadcast), rows held in registers.
      "trace @tiles {\n  %0 = input f64[512,1024]\n  %1 = input f16[1024]\n  %2 = add(%0, %1)\n"
      "  %3 = tanh(%2)\n  %4 = to(%3, f16) : f16[512,1024]\n  %5 = amax(%3, [1], true)\n  %6 = sub(%3, %5)\n"
      "  return %4, %6\n}\n",
      // Gathers (the index op): rows of an embedding, and a sum of gathered samples in a row.
      "trace @gather_rows {\n  %0 = input f32[50,64]\n  %1 = input i64[7,9]\n  %2 = index(%0, 0, %1) : f32[7,9,64]\n"
      "  %3 = add(%2, 1.0)\n  return %3\n}\n",
      "trace @gather_sum {\n  %0 = input f16[4,30,40]\n  %1 = input i32[30]\n  %2 = input i32[5,1]\n"
      "  %3 = index(%0, 1, %1, %2) : f16[4,5,30]\n  %4 = sum(%3, [2], false)\n  return %4\n}\n",
  };
  for (const char *t : traces) check_trace(t);

  // Long rows run a block per row: warp shuffles, a barrier around the shared-memory merge, and
  // the block size declared to ptxas.
  dynamo_status st;
  std::string ptx = to_ptx(traces[0], &st);
  assert_int_equal(st, DYNAMO_OK);
  assert_non_null(strstr(ptx.c_str(), "shfl.sync.bfly"));
  assert_non_null(strstr(ptx.c_str(), "bar.sync"));
  assert_non_null(strstr(ptx.c_str(), ".maxntid"));
  assert_non_null(strstr(ptx.c_str(), "ld.global"));  // tensors in the global address space
}

// The model blocks of the GPU cases (the Python front end's recordings of an encoder layer and
// an MLP block): their products become cuBLASLt calls, the rest kernels that ptxas accepts.
void test_model_blocks(void **) {
  for (const char *text : {block_encoder_f32(), block_mlp_f32(), block_encoder_bf16()}) check_trace(text);
}

// A side exit: the exit check entry (one thread: reads the condition, sets the status word),
// and the kernels after the guard start by reading the status word and leave when it is set;
// the kernel before the guard does not.
void test_side_exit_check(void **) {
  const char *text = "trace @ex {\n  %0 = input bool[] \n  %1 = input f32[1024]\n  %2 = exp(%1)\n"
                     "  %3 = guard(%0, true, 0, %2) : bool[]\n  %4 = mul(%2, %2)\n  %5 = sum(%4, [], false)\n"
                     "  return %2, %4, %5\n}\n";
  check_trace(text);
  dynamo_status st;
  std::string ptx = to_ptx(text, &st);
  assert_int_equal(st, DYNAMO_OK);
  assert_non_null(strstr(ptx.c_str(), ".entry dynamo_ex_exit_check("));
  // each .entry's first global load: the status word only in the kernels after the guard
  int after = 0, before = 0;
  for (size_t at = ptx.find(".entry "); at != std::string::npos; at = ptx.find(".entry ", at + 1)) {
    size_t end = ptx.find(".entry ", at + 1);
    std::string body = ptx.substr(at, end == std::string::npos ? std::string::npos : end - at);
    std::string name = body.substr(7, body.find('(') - 7);
    if (name.find("exit_check") != std::string::npos) continue;
    size_t ld = body.find("ld.global");  // the slot table's pointers are u64; the status word is u32
    bool reads_status = ld != std::string::npos && body.compare(ld, 13, "ld.global.u32") == 0;
    (name == "dynamo_ex_k0" ? before : after) += reads_status;
    if (name == "dynamo_ex_k0") assert_false(reads_status);
  }
  assert_int_equal(before, 0);
  assert_true(after >= 2);  // the product's kernel and the split sum's two
}

void test_refusals_and_no_device(void **) {
  dynamo_status st;
  to_ptx("trace @cs {\n  %0 = input f32[8,3]\n"
         "  %1 = extern aten::cumsum(%0, 0) : f32[8,3]\n  return %1\n}\n", &st);
  assert_int_equal(st, DYNAMO_ERR_UNSUPPORTED);
  assert_non_null(strstr(dynamo_last_error(), "only matrix products"));
  // A product is a cuBLASLt call between the kernels: the PTX holds the kernel after it.
  std::string mm = to_ptx("trace @mm {\n  %0 = input f32[8,3]\n  %1 = input f32[3,5]\n"
                          "  %2 = extern aten::mm(%0, %1) : f32[8,5]\n  %3 = relu(%2)\n  return %3\n}\n", &st);
  assert_int_equal(st, DYNAMO_OK);
  assert_non_null(strstr(mm.c_str(), ".entry"));
  dynamo_trace *t = nullptr;
  const char *text = "trace @x {\n  %0 = input f32[4]\n  %1 = neg(%0)\n  return %1\n}\n";
  assert_int_equal(dynamo_trace_parse(text, strlen(text), &t), DYNAMO_OK);
  char *ptx = reinterpret_cast<char *>(0x1);
  assert_int_equal(dynamo_trace_to_ptx(t, "gfx90a", &ptx), DYNAMO_ERR_UNSUPPORTED);
  assert_null(ptx);
  assert_int_equal(dynamo_trace_to_ptx(t, nullptr, &ptx), DYNAMO_ERR_INVALID_ARGUMENT);
  assert_int_equal(dynamo_trace_to_ptx(nullptr, "sm_90", &ptx), DYNAMO_ERR_INVALID_ARGUMENT);
  assert_int_equal(dynamo_trace_to_ptx(t, "sm_90", nullptr), DYNAMO_ERR_INVALID_ARGUMENT);
  dynamo_trace_destroy(t);

  char why[256] = "";
  dynamo_status s = dynamo_gpu_available(why, sizeof why);
  if (s == DYNAMO_OK) {
    print_message("a CUDA driver is present: the no-driver path is not exercised here\n");
  } else {
    assert_int_equal(s, DYNAMO_ERR_NO_DEVICE);
    assert_non_null(strstr(why, "no device"));
    assert_non_null(strstr(dynamo_last_error(), "libcuda.so.1"));
  }
}

}  // namespace

int main() {
  for (const char *p : {"/usr/local/cuda/bin/ptxas", "/usr/bin/ptxas"})
    if (access(p, X_OK) == 0) {
      g_ptxas = p;
      break;
    }
  if (g_ptxas.empty()) printf("ptx: ptxas not found (/usr/local/cuda/bin): PTX is generated but not assembled\n");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_pointwise_op),
      cmocka_unit_test(test_reductions_and_norms),
      cmocka_unit_test(test_model_blocks),
      cmocka_unit_test(test_side_exit_check),
      cmocka_unit_test(test_refusals_and_no_device),
  };
  return cmocka_run_group_tests_name("ptx", tests, nullptr, nullptr);
}
