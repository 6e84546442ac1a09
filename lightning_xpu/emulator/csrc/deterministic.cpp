// The determinism alerts of Intel's XPU kernels, for the emulated XPU.
//
// Under torch.use_deterministic_algorithms(True), an XPU kernel without a deterministic implementation calls
// at::globalContext().alertNotDeterministic(), which raises a RuntimeError (a UserWarning with warn_only=True).
// The emulator runs each operator as its CPU kernel, which has no such call; the fallback calls
// alert_if_nondeterministic() before it runs one. deterministic_alerts.inc, generated from torch-xpu-ops by
// ci/gen_deterministic_alerts.py, says which operators alert, with which message, under which conditions on their
// arguments; it lists what it does not model.

#include "emulator.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace xpu_emu {

namespace {

struct Cond {
  enum Kind { ARG_TRUE, ARG_PRESENT, ARG_INT_EQ, ARG_STR_EQ, ARG_FLOATING, ARG_EMPTY } kind;
  bool negated;
  const char* arg;
  int64_t value;     // ARG_INT_EQ
  const char* text;  // ARG_STR_EQ
};

struct Alert {
  const char* op;
  const char* overload;
  const char* message;
  int n_conds;
  Cond conds[3];  // MAX_CONDITIONS of the generator
};

const Alert kAlerts[] = {
#include "deterministic_alerts.inc"
};

const std::unordered_map<std::string, std::vector<const Alert*>>& alerts_by_op() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string, std::vector<const Alert*>>();
    for (const auto& a : kAlerts) (*t)[std::string(a.op) + "." + a.overload].push_back(&a);
    return t;
  }();
  return *table;
}

bool holds(const Cond& c, const c10::IValue& v) {
  const bool tensor = v.isTensor() && v.toTensor().defined();
  bool r = false;
  switch (c.kind) {
    case Cond::ARG_TRUE: r = v.isBool() && v.toBool(); break;
    case Cond::ARG_PRESENT: r = !v.isNone() && (!v.isTensor() || tensor); break;
    case Cond::ARG_INT_EQ: r = v.isInt() && v.toInt() == c.value; break;
    case Cond::ARG_STR_EQ: r = v.isString() && v.toStringRef() == c.text; break;
    case Cond::ARG_FLOATING: r = tensor && at::isFloatingType(v.toTensor().scalar_type()); break;
    case Cond::ARG_EMPTY: r = tensor && v.toTensor().numel() == 0; break;
  }
  return r != c.negated;
}

}  // namespace

void alert_if_nondeterministic(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first_arg) {
  auto& ctx = at::globalContext();
  if (!ctx.deterministicAlgorithms()) return;
  const auto& schema = op.schema();
  const auto& table = alerts_by_op();
  auto it = table.find(schema.name() + "." + schema.overload_name());
  if (it == table.end()) return;
  for (const Alert* a : it->second) {
    bool all = true;
    for (int i = 0; i < a->n_conds && all; ++i) {
      auto index = schema.argumentIndexWithName(a->conds[i].arg);
      TORCH_CHECK(index, "the XPU emulator's deterministic_alerts.inc does not fit ", schema.name(), ": it has no "
                  "argument '", a->conds[i].arg, "' (run ci/gen_deterministic_alerts.py for this torch)");
      all = holds(a->conds[i], stack[first_arg + *index]);
    }
    if (all) ctx.alertNotDeterministic(a->message);  // raises, or warns under warn_only=True
  }
}

}  // namespace xpu_emu
