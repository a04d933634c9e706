// Every allreduce algorithm that "auto" may choose and ROCE_PG_ALGO_ALLREDUCE
// may force, in one list (kAllreduceAlgorithms below). Each entry is a type
// declared beside its algorithm:
//
//   struct MyAllreduce {
//     static constexpr Algo id = Algo::Mine;
//     static constexpr const char* name = "mine";  // the ROCE_PG_ALGO_ALLREDUCE value
//     static constexpr bool amongMachines = true;  // a candidate among hier's machines
//     static constexpr bool pipelines = false;     // advances as a Pass (hier's overlapped form)
//     // Estimated seconds for `bytes` per rank among `s`; NaN where it does not
//     // apply. `across`: hier's choice among the machines (others ignore it).
//     static double cost(const CostConstants& k, const Shape& s, double bytes, Algo across);
//     static void run(const AllreduceCall& call);  // collective over call.team
//   };
//
// The cost model estimates every entry and picks the cheapest (cost_model.cpp),
// the settings accept every name (ROCE_PG_ALGO_ALLREDUCE, and the entries
// that run among machines for ROCE_PG_ALGO_ALLREDUCE_ACROSS), and allreduce.cpp
// and hier.cpp run the chosen entry. Only what is used is instantiated: the
// cost model links no algorithm's code. docs/ARCHITECTURE.md, "Adding an
// algorithm", has the steps.
#pragma once
#include <array>
#include <string_view>

#include "../common/error.hpp"

#include "allreduce_call.hpp"
#include "cost_model.hpp"
#include "hier.hpp"
#include "recursive.hpp"
#include "ring.hpp"
#include "select.hpp"
#include "tree.hpp"

namespace roce::algorithms {

template <class... Entries>
struct AlgorithmList {
  static constexpr int size = sizeof...(Entries);
  static_assert(size <= kMaxAllreduceAlgorithms, "raise kMaxAllreduceAlgorithms (cost_model.hpp)");
  static constexpr std::array<Algo, size> ids{Entries::id...};
  static constexpr std::array<const char*, size> names{Entries::name...};
  static constexpr std::array<bool, size> amongMachines{Entries::amongMachines...};
  static constexpr std::array<bool, size> pipelines{Entries::pipelines...};

  // The entry's position, or -1 when no entry has that id.
  static constexpr int indexOf(Algo a) {
    for (int i = 0; i < size; ++i)
      if (ids[i] == a) return i;
    return -1;
  }
  static constexpr int indexOf(std::string_view name) {
    for (int i = 0; i < size; ++i)
      if (name == names[i]) return i;
    return -1;
  }
  // The id of the entry called `name`; throws for a name no entry has (the
  // settings admit none, but code may fill a Config by hand).
  static Algo idOf(std::string_view name) {
    const int i = indexOf(name);
    if (i < 0) throwInvalid(str("no allreduce algorithm is called '", std::string(name), "'"));
    return ids[i];
  }
  static double cost(int i, const CostConstants& k, const Shape& s, double bytes, Algo across) {
    using Fn = double (*)(const CostConstants&, const Shape&, double, Algo);
    static constexpr Fn fns[] = {&Entries::cost...};
    return fns[i](k, s, bytes, across);
  }
  // Runs the entry with id `a`.
  static void run(Algo a, const AllreduceCall& call) {
    using Fn = void (*)(const AllreduceCall&);
    static constexpr Fn fns[] = {&Entries::run...};
    const int i = indexOf(a);
    if (i < 0) throwInvalid(str("no allreduce algorithm has the id ", static_cast<int>(a)));
    fns[i](call);
  }
};

// The order breaks ties between equal estimates (the earlier wins).
using AllreduceAlgorithms = AlgorithmList<RecursiveDoubling, Rabenseifner, RingAllreduce, TreeAllreduce, HierAllreduce>;

}  // namespace roce::algorithms
