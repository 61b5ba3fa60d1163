// The suite's host kernels, one extension module (suite/harness/fused_lamb.py builds it from every source here).

#include <torch/extension.h>

#include <vector>

void lamb_step(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, std::vector<at::Tensor> exp_avgs,
               std::vector<at::Tensor> exp_avg_sqs, double lr, double beta1, double beta2, double eps,
               double weight_decay, double c1, double c2);

void adamw_cmp_step(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, std::vector<at::Tensor> exp_avgs,
                    std::vector<at::Tensor> exp_avg_sqs, std::vector<at::Tensor> copies,
                    std::vector<double> weight_decays, double lr, double beta1, double beta2, double eps, double step,
                    double grad_mul, int64_t threads);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lamb_step", &lamb_step, "LAMB step over one param group (fused, two passes, threaded)",
        py::call_guard<py::gil_scoped_release>());
  m.def("adamw_cmp_step", &adamw_cmp_step,
        "AdamW step of a layer from bf16 gradients, writing the masters' bf16 copies (one pass, threaded)",
        py::call_guard<py::gil_scoped_release>());
}
