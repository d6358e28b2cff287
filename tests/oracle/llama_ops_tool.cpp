// Runs one of the Llama-family CPU ops forward and backward on tensors from a file, for
// tests/oracle/test_llama_ops_against_torch.py.
//
//   layup_llama_ops_tool OP INPUTS OUTPUTS
//
// INPUTS is a safetensors file holding the op's inputs and the upstream gradient, with its sizes
// and settings as "__metadata__" strings; OUTPUTS receives the results (F32). Per OP:
//   rmsnorm    x [N,C], weight [C], dout [N,C]; eps        -> out, rstd, dx, dweight
//   rope       qkv [B,T,(Hq+2Hkv)D], dout like qkv; Hq, Hkv, theta, and factor, low_freq_factor,
//              high_freq_factor, original_max_position_embeddings for llama3 scaling
//                                                         -> inv_freq, out, dqkv (both in place)
//   swiglu     gate_up [N,2I], dout [N,I]                 -> out, dgate_up
//   attention  qkv [B,T,(Hq+2Hkv)D], dout [B,T,Hq D]; Hq, Hkv -> out, dqkv
// Gradients are accumulated into zeros (rope's is rotated in place), so they are the gradients.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/ops/attention.h"
#include "backend/cpu/ops/rmsnorm.h"
#include "backend/cpu/ops/rope.h"
#include "backend/cpu/ops/swiglu.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace {

using namespace layup;

class Inputs {
 public:
  explicit Inputs(const std::string& path) : reader_(path) {}
  std::vector<float> tensor(const std::string& name) const { return reader_.read_floats(name); }
  // Dimension `axis` of tensor `name`.
  int dim(const std::string& name, size_t axis) const {
    const SafetensorsTensorInfo* info = reader_.find(name);
    LAYUP_CHECK(info && axis < info->shape.size(), reader_.path(), ": no axis ", axis, " of ",
                name);
    return static_cast<int>(info->shape[axis]);
  }
  bool has(const std::string& key) const { return reader_.metadata().count(key) > 0; }
  double number(const std::string& key) const {
    LAYUP_CHECK(has(key), reader_.path(), ": metadata has no ", key);
    return std::stod(reader_.metadata().at(key));
  }

 private:
  SafetensorsReader reader_;
};

struct Output {
  std::string name;
  std::vector<size_t> shape;
  std::vector<float> values;
};

void write(const std::string& path, const std::vector<Output>& outputs) {
  std::vector<SafetensorsTensor> tensors;
  for (const Output& output : outputs)
    tensors.push_back({output.name, output.shape, output.values.data(), {}});
  write_safetensors(path, tensors);
}

std::vector<Output> rmsnorm(const Inputs& in) {
  const int N = in.dim("x", 0), C = in.dim("x", 1);
  const std::vector<float> x = in.tensor("x"), weight = in.tensor("weight"),
                           dout = in.tensor("dout");
  std::vector<float> out(x.size()), rstd(N), dx(x.size(), 0.0f), dweight(C, 0.0f);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), weight.data(), N, C,
                  static_cast<float>(in.number("eps")));
  rmsnorm_backward(dx.data(), dweight.data(), dout.data(), x.data(), weight.data(), rstd.data(), N,
                   C);
  const size_t n = N, c = C;
  return {{"out", {n, c}, out}, {"rstd", {n}, rstd}, {"dx", {n, c}, dx}, {"dweight", {c}, dweight}};
}

std::vector<Output> rope(const Inputs& in) {
  const int B = in.dim("qkv", 0), T = in.dim("qkv", 1), row = in.dim("qkv", 2);
  const int Hq = static_cast<int>(in.number("Hq")), Hkv = static_cast<int>(in.number("Hkv"));
  const int D = row / (Hq + 2 * Hkv);
  RopeScaling scaling;
  if (in.has("factor")) {
    scaling = {true, static_cast<float>(in.number("factor")),
               static_cast<float>(in.number("low_freq_factor")),
               static_cast<float>(in.number("high_freq_factor")),
               static_cast<int>(in.number("original_max_position_embeddings"))};
  }
  std::vector<float> inv_freq(D / 2), cos(static_cast<size_t>(T) * D / 2), sin(cos.size());
  rope_inverse_frequencies(inv_freq.data(), D, static_cast<float>(in.number("theta")), scaling);
  rope_cos_sin(cos.data(), sin.data(), inv_freq.data(), T, D);
  // In place on the fused buffer, q and k heads in one call, as the model will run it.
  std::vector<float> qkv = in.tensor("qkv"), dqkv = in.tensor("dout");
  rope_forward(qkv.data(), qkv.data(), cos.data(), sin.data(), B, T, Hq + Hkv, D, row);
  rope_backward(dqkv.data(), dqkv.data(), cos.data(), sin.data(), B, T, Hq + Hkv, D, row);
  const std::vector<size_t> shape{static_cast<size_t>(B), static_cast<size_t>(T),
                                  static_cast<size_t>(row)};
  return {{"inv_freq", {inv_freq.size()}, inv_freq}, {"out", shape, qkv}, {"dqkv", shape, dqkv}};
}

std::vector<Output> swiglu(const Inputs& in) {
  const int N = in.dim("gate_up", 0), I = in.dim("gate_up", 1) / 2;
  const std::vector<float> gate_up = in.tensor("gate_up"), dout = in.tensor("dout");
  std::vector<float> out(static_cast<size_t>(N) * I), dgate_up(gate_up.size(), 0.0f);
  swiglu_forward(out.data(), gate_up.data(), N, I);
  swiglu_backward(dgate_up.data(), dout.data(), gate_up.data(), N, I);
  const size_t n = N, i = I;
  return {{"out", {n, i}, out}, {"dgate_up", {n, 2 * i}, dgate_up}};
}

std::vector<Output> attention(const Inputs& in) {
  const int B = in.dim("qkv", 0), T = in.dim("qkv", 1), row = in.dim("qkv", 2);
  const int Hq = static_cast<int>(in.number("Hq")), Hkv = static_cast<int>(in.number("Hkv"));
  const int D = row / (Hq + 2 * Hkv);
  const std::vector<float> qkv = in.tensor("qkv"), dout = in.tensor("dout");
  std::vector<float> out(dout.size()), att(static_cast<size_t>(B) * Hq * T * T),
      dqkv(qkv.size(), 0.0f);
  grouped_query_attention_forward(out.data(), att.data(), qkv.data(), B, T, Hq, Hkv, D);
  grouped_query_attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, Hq, Hkv,
                                   D);
  const size_t b = B, t = T;
  return {{"out", {b, t, static_cast<size_t>(Hq) * D}, out},
          {"dqkv", {b, t, static_cast<size_t>(row)}, dqkv}};
}

}  // namespace

int main(int argc, char** argv) {
  using Op = std::vector<Output> (*)(const Inputs&);
  const std::map<std::string, Op> ops{
      {"rmsnorm", rmsnorm}, {"rope", rope}, {"swiglu", swiglu}, {"attention", attention}};
  if (argc != 4 || !ops.count(argv[1])) {
    std::fprintf(stderr, "usage: layup_llama_ops_tool rmsnorm|rope|swiglu|attention IN OUT\n");
    return 2;
  }
  try {
    write(argv[3], ops.at(argv[1])(Inputs(argv[2])));
    return 0;
  } catch (const layup::Error& error) {
    std::fprintf(stderr, "layup_llama_ops_tool: %s\n", error.what());
    return 1;
  }
}
