// The rows of the wrapper tables (driver_hooks.cpp, runtime_hooks.cpp): the exported function,
// then the lookup variants 1..3 of its wrapper template (interposed_functions.hpp).
#pragma once

#define VL_VARIANTS(export_name, tmpl)                                                   \
  {reinterpret_cast<void*>(&export_name), reinterpret_cast<void*>(&tmpl<1>),             \
   reinterpret_cast<void*>(&tmpl<2>), reinterpret_cast<void*>(&tmpl<3>)}
// For templates shared by several functions of one signature (`F` names which).
#define VL_VARIANTS_F(export_name, tmpl, F)                                              \
  {reinterpret_cast<void*>(&export_name), reinterpret_cast<void*>(&tmpl<F, 1>),          \
   reinterpret_cast<void*>(&tmpl<F, 2>), reinterpret_cast<void*>(&tmpl<F, 3>)}
