//! dynamo from Rust, through its C API with nothing but the standard library's FFI: parse a
//! trace, compile it, run it on this program's own buffers, and check the numbers.
//!
//!   rustc --edition 2021 -O -L <dir of libdynamo.so> -l dynamo examples/rust/main.rs
use std::ffi::{c_char, c_void, CStr};
use std::ptr;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32, // kDLCPU = 1
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8, // kDLFloat = 2
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
union ArgValue {
    tensor: *const DLTensor,
    i: i64,
    f: f64,
    b: i32,
}

#[repr(C)]
struct Arg {
    kind: i32, // DYNAMO_ARG_TENSOR = 0, DYNAMO_ARG_FLOAT = 2
    flags: u32,
    u: ArgValue,
}

enum Engine {}
enum Frame {}
enum Trace {}
enum Entry {}

extern "C" {
    fn dynamo_abi_version() -> u32;
    fn dynamo_last_error() -> *const c_char;
    fn dynamo_engine_create(opts: *const c_void, out: *mut *mut Engine) -> i32;
    fn dynamo_engine_destroy(e: *mut Engine) -> i32;
    fn dynamo_frame_create(e: *mut Engine, name: *const c_char, out: *mut *mut Frame) -> i32;
    fn dynamo_frame_destroy(f: *mut Frame) -> i32;
    fn dynamo_trace_parse(text: *const c_char, len: usize, out: *mut *mut Trace) -> i32;
    fn dynamo_trace_destroy(t: *mut Trace);
    fn dynamo_compile_frame(f: *mut Frame, t: *const Trace, out: *mut *mut Entry) -> i32;
    fn dynamo_entry_run(e: *mut Entry, args: *const Arg, nargs: usize, outs: *const DLTensor, nouts: usize) -> i32;
}

fn check(status: i32, what: &str) {
    if status != 0 {
        let msg = unsafe { CStr::from_ptr(dynamo_last_error()) }.to_string_lossy();
        eprintln!("{what} failed (status {status}): {msg}");
        std::process::exit(1);
    }
}

fn tensor(data: &mut [f32], shape: &mut [i64; 1]) -> DLTensor {
    DLTensor {
        data: data.as_mut_ptr() as *mut c_void,
        device: DLDevice { device_type: 1, device_id: 0 },
        ndim: 1,
        dtype: DLDataType { code: 2, bits: 32, lanes: 1 },
        shape: shape.as_mut_ptr(),
        strides: ptr::null_mut(),
        byte_offset: 0,
    }
}

fn main() {
    const N: usize = 1000;
    let text = "trace @rust {\n  %0 = input f32[1000]\n  %1 = input f64\n  %2 = mul(%0, %1)\n  %3 = tanh(%2)\n  %4 = add(%3, 1.0)\n  return %4\n}\n";
    unsafe {
        println!("dynamo ABI {}", dynamo_abi_version());
        let mut engine = ptr::null_mut();
        check(dynamo_engine_create(ptr::null(), &mut engine), "dynamo_engine_create");
        let mut frame = ptr::null_mut();
        check(dynamo_frame_create(engine, b"rust\0".as_ptr() as *const c_char, &mut frame), "dynamo_frame_create");
        let mut trace = ptr::null_mut();
        check(dynamo_trace_parse(text.as_ptr() as *const c_char, text.len(), &mut trace), "dynamo_trace_parse");
        let mut entry = ptr::null_mut();
        check(dynamo_compile_frame(frame, trace, &mut entry), "dynamo_compile_frame");
        dynamo_trace_destroy(trace);

        let mut x: Vec<f32> = (0..N).map(|i| (i as f32 - 500.0) / 100.0).collect();
        let mut y = vec![0.0f32; N];
        let (mut sx, mut sy) = ([N as i64], [N as i64]);
        let tx = tensor(&mut x, &mut sx);
        let ty = tensor(&mut y, &mut sy);
        let args = [Arg { kind: 0, flags: 0, u: ArgValue { tensor: &tx } }, Arg { kind: 2, flags: 0, u: ArgValue { f: 0.5 } }];
        check(dynamo_entry_run(entry, args.as_ptr(), 2, &ty, 1), "dynamo_entry_run");

        let err = x.iter().zip(&y).map(|(a, b)| ((a * 0.5).tanh() + 1.0 - b).abs()).fold(0.0f32, f32::max);
        println!("y[0] = {:.6}, y[999] = {:.6}, max error vs Rust's tanh: {:.2e}", y[0], y[N - 1], err);
        check(dynamo_frame_destroy(frame), "dynamo_frame_destroy");
        check(dynamo_engine_destroy(engine), "dynamo_engine_destroy");
        if err > 1e-6 {
            eprintln!("results differ");
            std::process::exit(1);
        }
    }
}
