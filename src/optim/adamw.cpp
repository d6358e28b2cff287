// AdamW update loops: the constants of a step, then the element loop of optim/adamw_simd.h
// (the SIMD level chosen at run time), spread over the OpenMP threads of the caller.
#include "optim/adamw.h"

#include <omp.h>

#include "optim/adamw_simd.h"

namespace layup {

void adamw_update(float* params, const float* grads, float* m, float* v, size_t count,
                  const AdamWStep& step, bool decay) {
  const AdamWConstants constants = adamw_constants(step, decay);
  const AdamWKernel kernel = default_adamw_kernel();
  // Below this size waking the thread team costs more than the loop itself (a bias or a gain).
  constexpr size_t kMinParallelCount = size_t{1} << 15;
  if (count < kMinParallelCount) {
    kernel(AdamWBuffers::in_place(params, grads, m, v), count, constants);
    return;
  }
  // One contiguous share per thread, cut at cache lines. The update is elementwise, so how the
  // elements are shared out cannot change the result.
#pragma omp parallel
  {
    const ElementRange share = adamw_share(count, omp_get_thread_num(), omp_get_num_threads());
    kernel(AdamWBuffers::in_place(params, grads, m, v).at(share.begin), share.end - share.begin,
           constants);
  }
}

void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                       const float* grads, float* m, float* v, const AdamWStep& step) {
  for (const TensorSpec& tensor : layout.tensors_in(span)) {
    const size_t at = tensor.offset_in_span;
    adamw_update(params + at, grads + at, m + at, v + at, tensor.count, step, tensor.weight_decay);
  }
}

void adamw_update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                            size_t count, float* params, const float* grads, float* m, float* v,
                            const AdamWStep& step) {
  const size_t end = first + count;
  for (const TensorSpec& tensor : layout.tensors_in(span)) {
    const size_t begin = std::max(first, tensor.offset_in_span);
    const size_t stop = std::min(end, tensor.offset_in_span + tensor.count);
    if (begin >= stop) continue;
    const size_t at = begin - first;
    adamw_update(params + at, grads + at, m + at, v + at, stop - begin, step, tensor.weight_decay);
  }
}

}  // namespace layup
