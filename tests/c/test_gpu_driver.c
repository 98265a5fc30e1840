/* test_gpu_driver.c -- loading the CUDA driver without a GPU: with no libcuda.so.1, with a
 * stand-in that reports no device, with one lacking a versioned entry point, and with one that
 * reports a device. Each asks dynamo_gpu_available and for a CUDA engine and checks the status
 * and the message. Run once per case (ctest sets DYNAMO_LIBCUDA and GPU_CASE). */
#include "helpers.h"

static void expect_engine(dynamo_status want, const char *needle) {
  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  o.device_type = kDLCUDA;
  dynamo_engine *e = NULL;
  assert_status_msg(dynamo_engine_create(&o, &e), want, needle);
  assert_null(e);
}

static void test_driver_case(void **state) {
  (void)state;
  const char *c = getenv("GPU_CASE");
  char why[256] = "";
  if (!c || strcmp(c, "absent") == 0) {
    dynamo_status s = dynamo_gpu_available(why, sizeof why);
    if (s == DYNAMO_OK) { print_message("a CUDA driver is installed here; skipping the absent-driver case\n"); return; }
    assert_int_equal(s, DYNAMO_ERR_NO_DEVICE);
    assert_non_null(strstr(why, "no device: cannot open"));
    expect_engine(DYNAMO_ERR_NO_DEVICE, "no device");
  } else if (strcmp(c, "nodevice") == 0) {
    assert_int_equal(dynamo_gpu_available(why, sizeof why), DYNAMO_ERR_NO_DEVICE);
    assert_non_null(strstr(why, "0 devices"));
    expect_engine(DYNAMO_ERR_NO_DEVICE, "0 devices");
  } else if (strcmp(c, "old") == 0) {
    assert_int_equal(dynamo_gpu_available(why, sizeof why), DYNAMO_ERR_NO_DEVICE);
    assert_non_null(strstr(why, "lacks cuMemAlloc_v2"));
  } else {
    assert_int_equal(dynamo_gpu_available(why, sizeof why), DYNAMO_OK);
    expect_engine(DYNAMO_ERR_UNSUPPORTED, "Fake GPU, sm_90");
    dynamo_engine_options o;
    dynamo_engine_options_init(&o);
    o.device_type = kDLCUDA;
    o.device_index = 3;
    dynamo_engine *e = NULL;
    assert_status_msg(dynamo_engine_create(&o, &e), DYNAMO_ERR_NO_DEVICE, "device 3 does not exist");
  }
  /* CPU engines are unaffected either way. */
  dynamo_engine *cpu = NULL;
  assert_ok(dynamo_engine_create(NULL, &cpu));
  dynamo_engine_destroy(cpu);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_driver_case)};
  return cmocka_run_group_tests_name("gpu_driver", tests, NULL, NULL);
}
