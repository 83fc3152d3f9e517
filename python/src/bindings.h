// What the extension's parts share: the plan as Python holds it, and each part's registration.
#ifndef LOADSTONE_PYTHON_BINDINGS_H_
#define LOADSTONE_PYTHON_BINDINGS_H_

#include <memory>

#include <nanobind/nanobind.h>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"

namespace loadstone::python {

// A plan with the checkpoint it was made for (names for its indices).
struct PyPlan {
  Checkpoint checkpoint;
  std::shared_ptr<const LoadPlan> plan;
};

void RegisterCheckpoint(nanobind::module_& m);  // py_checkpoint.cc
void RegisterLoad(nanobind::module_& m);        // py_load.cc
void RegisterModel(nanobind::module_& m);       // py_model.cc

nanobind::dict ProgressDict(const Progress& p);     // py_stats.cc
nanobind::dict ReadStatsDict(const ReadStats& s);   // py_stats.cc

}  // namespace loadstone::python

#endif  // LOADSTONE_PYTHON_BINDINGS_H_
