// recordkit's TensorFlow op: byte strings cut from a uint8 tensor with one copy each.
//
// RecordkitStrings(values: uint8, starts: int64 [n], lengths: int64 [n]) -> string [n]
//
// recordkit.tf's native path decodes a task's records into dense arrays in C (GIL
// released); a Bytes() feature comes out as rows of a uint8 array plus their lengths.
// TensorFlow has no op that makes tf.string elements from a numeric tensor: without
// this one each value is copied twice more (into one big tf.string, then out of it
// with tf.strings.substr). Here a value of `view_min_bytes` or more is not copied at
// all: its element is a shared view (tstring::assign_as_shared_view) into the uint8
// tensor, which a reference-counted owner keeps alive while any element -- or any
// copy of one that TensorFlow makes -- still points into it (as TensorFlow's own
// zero-copy strings do). Smaller values are copied: a view would keep a whole task's
// buffer alive for a few bytes, and small copies come from malloc's caches. Large
// copies do not: each 256 KiB string is fresh memory, and its first touch costs a
// page fault per 4 KiB (most of the time of a copy on the VMs measured).
//
// Built against the installed TensorFlow when one is importable at build time
// (setup.py); recordkit/tf/native.py loads it with tf.load_op_library when the
// TensorFlow it was built for (embedded below) is the one imported, and falls back
// to the two copies when it is absent, built for another TensorFlow, or does not load.
#include <cstdint>

#ifndef RECORDKIT_TF_VERSION
#define RECORDKIT_TF_VERSION "unknown"
#endif

// Read from the file's bytes by recordkit/tf/native.py before it loads the library.
extern "C" __attribute__((visibility("default"), used)) const char recordkit_tfop_built_for[] =
    "recordkit-tfop-built-for-tensorflow " RECORDKIT_TF_VERSION;

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;

REGISTER_OP("RecordkitStrings")
    .Input("values: uint8")
    .Input("starts: int64")
    .Input("lengths: int64")
    .Output("output: string")
    .Attr("view_min_bytes: int = 4096")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    });

class RecordkitStringsOp : public OpKernel {
 public:
  explicit RecordkitStringsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("view_min_bytes", &view_min_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& starts = ctx->input(1);
    const Tensor& lengths = ctx->input(2);
    OP_REQUIRES(ctx, starts.dims() == 1 && lengths.dims() == 1,
                InvalidArgument("starts and lengths must be vectors"));
    const int64_t n = starts.dim_size(0);
    OP_REQUIRES(ctx, lengths.dim_size(0) == n,
                InvalidArgument("starts and lengths differ in length: ", n, " and ",
                                lengths.dim_size(0)));
    const int64_t size = values.NumElements();
    const char* base = reinterpret_cast<const char*>(values.data());
    auto s = starts.flat<int64_t>();
    auto l = lengths.flat<int64_t>();
    for (int64_t i = 0; i < n; i++) {
      OP_REQUIRES(ctx, s(i) >= 0 && l(i) >= 0 && s(i) <= size && l(i) <= size - s(i),
                  InvalidArgument("value ", i, " (start ", s(i), ", length ", l(i),
                                  ") is outside the ", size, " bytes given"));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out));
    auto o = out->flat<tensorflow::tstring>();
    // The owner holds a reference to the values' buffer; each view takes one of its own.
    auto* owner = new tensorflow::tstring::owner<Tensor>(values);
    for (int64_t i = 0; i < n; i++) {
      const size_t len = static_cast<size_t>(l(i));
      if (l(i) >= view_min_) {
        o(i).assign_as_shared_view(base + s(i), len, owner);
      } else {
        o(i).assign(base + s(i), len);
      }
    }
    owner->Unref();
  }

 private:
  int64_t view_min_;
};

REGISTER_KERNEL_BUILDER(Name("RecordkitStrings").Device(DEVICE_CPU), RecordkitStringsOp);

}  // namespace
