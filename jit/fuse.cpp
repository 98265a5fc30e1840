// fuse.cpp -- fusion partitioning. Key idea: a pointwise value is recomputed inline in every
// loop that reads it at the same number of elements; it is materialized into a buffer only
// when something needs memory (an extern, a view, a broadcast to a larger shape, an output).
// Views never copy unless a reshape cannot be expressed with strides (then its source is
// copied once, as ATen's reshape would).
#include "fuse.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>

namespace dynamo::jit {

Map compose_map(const Type &user, const Type &operand, const Map &m) {
  const auto &vs = user.sizes, &os = operand.sizes;
  Map r(os.size(), -1);
  size_t off = vs.size() - os.size();
  for (size_t k = 0; k < os.size(); ++k) r[k] = os[k] == 1 ? -1 : m[k + off];
  return r;
}

Map operand_map(const Trace &t, int32_t v, size_t k, const Map &m) {
  const Inst &in = t.insts[t.def[v]];
  const Type &ut = t.types[v], &ot = t.types[in.args[k].value];
  if (in.op != Op::index) return compose_map(ut, ot, m);
  const int64_t first = in.args[1].i, nidx = (int64_t)in.args.size() - 2;
  const int64_t x_rank = t.types[in.args[0].value].rank();
  const int64_t block = ut.rank() - (x_rank - nidx);  // the broadcast index shape's rank
  Map r(ot.sizes.size(), -1);
  for (int64_t d = 0; d < ot.rank(); ++d) {
    if (ot.sizes[d] == 1) continue;
    if (k == 0) {  // the source: its dims before and after the indexed ones
      if (d < first) r[d] = m[d];
      else if (d >= first + nidx) r[d] = m[d - nidx + block];
    } else {       // an index tensor, right-aligned in the block
      r[d] = m[first + block - ot.rank() + d];
    }
  }
  return r;
}

Map row_map(const Group &g, const std::vector<int64_t> &shape) {
  const auto &d = g.domain;
  auto reduced = [&](size_t k) { return std::binary_search(g.rdims.begin(), g.rdims.end(), (int64_t)k); };
  std::vector<int64_t> keep, drop;
  Map mkeep, mdrop;
  for (size_t k = 0; k < d.size(); ++k) {
    if (reduced(k)) {
      keep.push_back(1);
      mkeep.push_back(-1);
    } else {
      keep.push_back(d[k]);
      drop.push_back(d[k]);
      mkeep.push_back(d[k] == 1 ? -1 : (int32_t)k);
      mdrop.push_back(d[k] == 1 ? -1 : (int32_t)k);
    }
  }
  if (shape == keep) return mkeep;
  if (shape == drop) return mdrop;
  return {};
}

namespace {

// ATen's stride computation for a view of (sizes, strides) as new sizes; false if impossible.
bool reshape_strides(const std::vector<int64_t> &old_sizes, const std::vector<int64_t> &old_strides,
                     const std::vector<int64_t> &new_sizes, std::vector<int64_t> *out) {
  int64_t numel = 1;
  for (int64_t s : old_sizes) numel *= s;
  std::vector<int64_t> ns(new_sizes.size());
  if (numel == 0) {
    *out = contiguous_strides(new_sizes);
    return true;
  }
  if (old_sizes.empty()) {  // a 0-dim tensor viewed as [1], [1,1], ...: one element, any strides
    *out = std::vector<int64_t>(new_sizes.size(), 1);
    return true;
  }
  int64_t view_d = (int64_t)new_sizes.size() - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = (int64_t)old_sizes.size() - 1; td >= 0; td--) {
    tensor_numel *= old_sizes[td];
    if (td == 0 || (old_sizes[td - 1] != 1 && old_strides[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        ns[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (td > 0) {
        chunk_base_stride = old_strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return false;
  *out = ns;
  return true;
}

struct Planner {
  const Trace &t;
  Plan p;
  ValueUsers users;  // value -> (inst, operand)
  std::vector<int32_t> copy_slot;    // value -> contiguous copy slot made for a reshape
  std::vector<std::vector<Root>> roots_at;  // inst index -> roots to compute after it

  PlanOptions opt;
  Planner(const Trace &tr, const PlanOptions &o) : t(tr), opt(o) {}

  int32_t new_slot(int64_t bytes) {
    p.scratch_bytes.push_back(bytes);
    return p.num_slots++;
  }
  // Computed inline by the loops that read it: pointwise ops, and gathers (index), whose
  // source operand is read from memory at computed positions (is_gather_source).
  bool is_pointwise(int32_t v) const {
    OpKind k = op_info(t.insts[t.def[v]].op).kind;
    return k == OpKind::POINTWISE || k == OpKind::GATHER;
  }
  static bool is_gather_source(const Inst &in, size_t k) { return in.op == Op::index && k == 0; }
  bool is_reduction(int32_t v) const { return op_info(t.insts[t.def[v]].op).kind == OpKind::REDUCTION; }
  bool is_computed(int32_t v) const { return is_pointwise(v) || is_reduction(v); }
  std::vector<char> need_mat;  // reductions read outside their row's registers
  std::vector<int64_t> inline_ops;  // per value: the ops a loop evaluates to compute it inline
  std::vector<int64_t> group_ops;   // per group: the inline ops of its roots (kMaxInlineOps)

  void run() {
    size_t nv = t.types.size();
    p.num_inputs = (int32_t)t.inputs.size();
    p.num_outputs = (int32_t)t.outputs.size();
    p.num_slots = p.num_inputs + p.num_outputs;
    p.scratch_bytes.assign(p.num_slots, 0);
    p.buffer_backed.assign(nv, 0);
    p.views.assign(nv, {});
    p.group_of.assign(nv, -1);
    p.materialized.assign(nv, 0);
    p.scalar_slot.assign(nv, -1);
    users = value_users(t);
    copy_slot.assign(nv, -1);
    need_mat.assign(nv, 0);
    roots_at.assign(t.insts.size(), {});

    decide_materialization();
    assign_buffers();
    plan_mutations();
    find_output_aliases();
    schedule();
    materialize_late();
    plan_splits();
    schedule_mutations();
  }

  bool reads_own_reduction(int32_t v, int32_t g) {
    if (is_reduction(v)) return p.group_of[v] == g;
    if (!is_pointwise(v) || !computed_in(v, g)) return false;
    for (const Operand &o : t.insts[t.def[v]].args)
      if (o.kind == Operand::Value && t.types[o.value].tensor && reads_own_reduction(o.value, g)) return true;
    return false;
  }

  // Whole-tensor reductions big enough to share among threads: split into partial reductions.
  void plan_splits() {
    const int64_t kMinElems = 1 << 18;
    const int32_t kChunks = opt.split_chunks;
    for (int32_t g = 0; g < (int32_t)p.groups.size(); ++g) {
      Group &gr = p.groups[g];
      if (!gr.row || !gr.roots.empty() || gr.optional_slot >= 0) continue;
      int64_t total = 1, outer = 1;
      for (size_t d = 0; d < gr.domain.size(); ++d) {
        total *= gr.domain[d];
        if (!std::binary_search(gr.rdims.begin(), gr.rdims.end(), (int64_t)d)) outer *= gr.domain[d];
      }
      if (outer != 1 || total < kMinElems) continue;
      bool dependent = false;
      for (int32_t r : gr.reductions) dependent = dependent || reads_own_reduction(t.insts[t.def[r]].args[0].value, g);
      if (dependent) continue;
      gr.split_chunks = kChunks;
      gr.split_slot = new_slot((int64_t)kChunks * (int64_t)gr.reductions.size() * 4 * 8);
    }
  }

  // -- copy_: writes into input memory happen last, after every read of the old contents --
  std::vector<int32_t> mutations;  // copy_ values in program order
  std::vector<BufferView> mutation_dest;

  BufferView dest_of(int32_t d) {  // the input memory a copy_ destination names
    // Up through copy_ destinations and views to the input (iteratively: chains may be long),
    // then each view folded over the memory below it, leaving the plan's views untouched.
    std::vector<int32_t> chain;  // the views on the way, from d up
    for (;;) {
      const Inst &def = t.insts[t.def[d]];
      if (def.op == Op::copy_) {
        d = def.args[0].value;
      } else if (def.op == Op::input) {
        break;
      } else {
        chain.push_back(d);
        d = def.args[0].value;
      }
    }
    BufferView cur = p.views[d];
    for (size_t k = chain.size(); k-- > 0;) {
      int32_t w = chain[k], src = t.insts[t.def[w]].args[0].value;
      BufferView saved_src = p.views[src], saved = p.views[w];
      char saved_bb = p.buffer_backed[w];
      p.views[src] = cur;
      fold_view(t.def[w]);
      cur = p.views[w];
      p.views[src] = saved_src;
      p.views[w] = saved;
      p.buffer_backed[w] = saved_bb;
    }
    return cur;
  }

  // The memory an inline expression reads: (slot, coefficients over `rank` dims + offset).
  // Walked with an explicit stack; past kMaxLeafWalk nodes (a long chain of writes, a DAG whose
  // paths multiply) it gives up with a hazard, and the write goes through a buffer of its own.
  using Access = std::pair<int32_t, std::vector<int64_t>>;
  static constexpr size_t kMaxLeafWalk = 256;
  void leaves(int32_t v0, const Map &m0, size_t rank, std::vector<Access> &out) {
    std::vector<std::pair<int32_t, Map>> stack;
    stack.push_back({v0, m0});
    size_t walked = 0;
    while (!stack.empty()) {
      auto [v, m] = std::move(stack.back());
      stack.pop_back();
      if (++walked > kMaxLeafWalk) {
        out.push_back({-1, {}});
        return;
      }
      const Inst &in = t.insts[t.def[v]];
      if ((is_pointwise(v) || in.op == Op::copy_) && !p.materialized[v]) {
        size_t first = in.op == Op::copy_ ? 1 : 0;  // a copy_'s value does not read its destination
        for (size_t k = first; k < in.args.size(); ++k) {
          const Operand &o = in.args[k];
          if (is_gather_source(in, k)) {
            out.push_back({-1, {}});  // read at positions only the data knows: a hazard
            continue;
          }
          if (o.kind == Operand::Value && t.types[o.value].tensor) stack.push_back({o.value, operand_map(t, v, k, m)});
        }
        continue;
      }
      if (!p.buffer_backed[v]) {
        out.push_back({-1, {}});  // not in memory yet (a reduction): treat as a hazard
        continue;
      }
      const BufferView &bv = p.views[v];
      std::vector<int64_t> coef(rank + 1, 0);
      for (size_t k = 0; k < m.size(); ++k)
        if (m[k] >= 0) coef[m[k]] += bv.strides[k];
      coef[rank] = bv.offset;
      out.push_back({bv.slot, coef});
    }
  }

  void plan_mutations() {
    for (size_t i = 0; i < t.insts.size(); ++i)
      if (t.insts[i].op == Op::copy_) {
        mutations.push_back(t.insts[i].results[0]);
        mutation_dest.push_back(dest_of(t.insts[i].args[0].value));
        if (mutation_dest.back().slot >= p.num_inputs)
          fail(ErrorCode::Unsupported, "copy_ into a reshape that cannot view its input's memory (a non-contiguous "
                                       "input); the destination must be a strided view of an input");
      }
    next_guard.assign(t.insts.size() + 1, -1);
    for (size_t i = t.insts.size(); i-- > 0;)
      next_guard[i] = t.insts[i].op == Op::guard ? (int32_t)i : next_guard[i + 1];
    if (next_guard[0] < 0) {
      order_mutations();
      return;
    }
    std::unordered_set<int32_t> written;  // the slots of the writes before write k
    for (size_t k = 0; k < mutations.size(); ++k) {
      if (k) written.insert(mutation_dest[k - 1].slot);
      std::set<int32_t> reads;
      bool hazard = !mutation_reads(k, reads);
      for (int32_t s : reads) hazard = hazard || written.count(s);
      if (hazard || read_before_flush(mutations[k])) materialize_at_def(mutations[k]);
    }
  }

  // The memory write k's kernel reads where it runs (its value's inline expression): the input
  // slots, into `slots`. False when it must go through a buffer of its own: it reads memory not
  // in place yet (a reduction, a walk too long), or its own destination at other elements than
  // the one it writes.
  bool mutation_reads(size_t k, std::set<int32_t> &slots) {
    int32_t c = mutations[k];
    const Type &ty = t.types[c];
    size_t rank = ty.sizes.size();
    Map id(rank);
    for (size_t d = 0; d < rank; ++d) id[d] = ty.sizes[d] == 1 ? -1 : (int32_t)d;
    std::vector<Access> reads;
    leaves(c, id, rank, reads);
    std::vector<int64_t> own(rank + 1, 0);
    for (size_t d = 0; d < rank; ++d)
      if (ty.sizes[d] != 1) own[d] = mutation_dest[k].strides[d];
    own[rank] = mutation_dest[k].offset;
    for (const Access &a : reads) {
      if (a.first < 0) return false;
      std::vector<int64_t> have = a.second;
      for (size_t d = 0; d < rank; ++d)
        if (ty.sizes[d] == 1) have[d] = 0;
      if (a.first == mutation_dest[k].slot && have != own) return false;
      slots.insert(a.first);
    }
    return true;
  }

  // Without side exits the writes run after the whole trace, each one kernel, and their order
  // is free but for two rules: writes into one input keep program order, and a write whose
  // expression reads an input's old contents runs before every other write into that input.
  // A write that a later one replaces exactly (same memory, view and shape) is not made. Program
  // order where the rules allow; a write caught in a cycle of them goes through a buffer of its
  // own (computed where it is defined, it then reads nothing at the end). SGD's momentum step
  // (`buf.mul_(m).add_(g); p.add_(buf, alpha=-lr)`) then writes p before buf, both straight
  // from the inputs, one parameter after another, with no scratch buffer.
  void order_mutations() {
    {  // drop the writes replaced exactly by a later one
      std::map<std::tuple<int32_t, int64_t, std::vector<int64_t>, std::vector<int64_t>>, size_t> later;
      std::vector<char> replaced(mutations.size(), 0);
      for (size_t k = mutations.size(); k-- > 0;) {
        auto key = std::make_tuple(mutation_dest[k].slot, mutation_dest[k].offset, mutation_dest[k].strides,
                                   t.types[mutations[k]].sizes);
        replaced[k] = later.count(key) != 0;
        later[key] = k;
      }
      size_t n = 0;
      for (size_t k = 0; k < mutations.size(); ++k)
        if (!replaced[k]) {
          mutations[n] = mutations[k];
          mutation_dest[n++] = mutation_dest[k];
        }
      mutations.resize(n);
      mutation_dest.resize(n);
    }
    size_t n = mutations.size();
    std::vector<std::set<int32_t>> reads(n);
    for (size_t k = 0; k < n; ++k)
      if (!mutation_reads(k, reads[k])) {
        materialize_at_def(mutations[k]);
        reads[k].clear();
      }
    // Edges k -> j (k runs first): flags 1 for the order of writes into one input, 2 for a read
    // of an input's old contents before j writes it.
    std::map<int32_t, std::vector<size_t>> writers;  // input slot -> the writes into it, in order
    for (size_t k = 0; k < n; ++k) writers[mutation_dest[k].slot].push_back(k);
    std::vector<std::map<size_t, int>> after(n);
    std::vector<size_t> indeg(n, 0);
    auto edge = [&](size_t k, size_t j, int flag) {
      int &f = after[k][j];
      if (!f) ++indeg[j];
      f |= flag;
    };
    for (auto &[slot, ks] : writers)
      for (size_t i = 1; i < ks.size(); ++i) edge(ks[i - 1], ks[i], 1);
    for (size_t k = 0; k < n; ++k)
      for (int32_t s : reads[k]) {
        auto it = writers.find(s);
        if (it != writers.end())
          for (size_t j : it->second)
            if (j != k) edge(k, j, 2);
      }
    std::vector<char> done(n, 0);
    std::vector<size_t> order;
    order.reserve(n);
    std::set<size_t> ready;  // by program order
    for (size_t k = 0; k < n; ++k)
      if (!indeg[k]) ready.insert(k);
    size_t cursor = 0;  // (cycles: the first write not done that still reads)
    while (order.size() < n) {
      if (ready.empty()) {
        // A cycle (the write-order edges alone have none): the first write left that reads
        // goes through a buffer of its own and reads nothing at the end.
        auto reads_before_a_write = [&](size_t k) {
          for (auto &[j, f] : after[k])
            if ((f & 2) && !done[j]) return true;
          return false;
        };
        while (done[cursor] || !reads_before_a_write(cursor)) ++cursor;
        size_t k = cursor;
        materialize_at_def(mutations[k]);
        reads[k].clear();
        for (auto it = after[k].begin(); it != after[k].end();) {
          it->second &= ~2;
          if (!it->second) {
            if (--indeg[it->first] == 0 && !done[it->first]) ready.insert(it->first);
            it = after[k].erase(it);
          } else {
            ++it;
          }
        }
        continue;
      }
      size_t pick = *ready.begin();
      ready.erase(ready.begin());
      done[pick] = 1;
      order.push_back(pick);
      for (auto &[j, f] : after[pick])
        if (--indeg[j] == 0) ready.insert(j);
    }
    std::vector<int32_t> m2(n);
    std::vector<BufferView> d2(n);
    for (size_t i = 0; i < n; ++i) {
      m2[i] = mutations[order[i]];
      d2[i] = mutation_dest[order[i]];
    }
    mutations = std::move(m2);
    mutation_dest = std::move(d2);
  }

  // The value of an in-place write gets a buffer of its own, stored where it is defined.
  void materialize_at_def(int32_t c) {
    if (p.materialized[c]) return;
    const Type &ty = t.types[c];
    int32_t s = new_slot(ty.numel() * dtype_bytes(ty.dtype));
    p.materialized[c] = 1;
    p.buffer_backed[c] = 1;
    p.views[c] = {s, 0, contiguous_strides(ty.sizes)};
    roots_at[t.def[c]].insert(roots_at[t.def[c]].begin(), Root{c, s});
  }

  // Is in-place write c flushed before a side exit (schedule_mutations then reads it from its
  // destination) and read by an instruction before that exit? Such a reader is scheduled before
  // the flush and would load the destination's old contents: c needs a buffer of its own.
  std::vector<int32_t> next_guard;  // per instruction: the first side exit at or after it, or -1
  bool read_before_flush(int32_t c) {
    int32_t guard = next_guard[(size_t)t.def[c] + 1];
    if (guard < 0) return false;
    for (auto [i, k] : users[c])
      if (i < guard && !(t.insts[i].op == Op::copy_ && k == 0)) return true;  // not as a destination
    return false;
  }

  void find_output_aliases() {
    p.output_alias.assign(p.num_outputs, {});
    for (int32_t k = 0; k < p.num_outputs; ++k) {
      int32_t v = t.outputs[k], slot = p.num_inputs + k;
      OutputAlias a;
      // The memory must hold exactly this value after the call: no later in-place write to it.
      auto last_writer = [&](int32_t slot) {
        int32_t w = -1;
        for (size_t m = 0; m < mutations.size(); ++m)
          if (mutation_dest[m].slot == slot) w = mutations[m];
        return w;
      };
      int32_t b = v;  // through views to the memory's owner: an input or an in-place write
      while (op_info(t.insts[t.def[b]].op).kind == OpKind::VIEW) b = t.insts[t.def[b]].args[0].value;
      const Inst &bi = t.insts[t.def[b]];
      if (bi.op != Op::copy_ && (bi.op != Op::input || !t.types[b].tensor)) continue;
      a.view = dest_of(v);
      if (a.view.slot >= p.num_inputs) continue;  // e.g. a reshape that had to copy
      if (last_writer(a.view.slot) != (bi.op == Op::copy_ ? b : -1)) continue;
      if (!t.types[a.view.slot < p.num_inputs ? t.inputs[a.view.slot] : 0].tensor) continue;
      a.input = a.view.slot;
      p.output_alias[k] = a;
      for (auto &rs : roots_at)
        for (Root &r : rs)
          if (r.slot == slot && r.value == v) r.optional = true;
    }
    // Outputs that are an extern's result (contiguous memory of their own, never written again).
    p.output_extern_slot.assign(p.num_outputs, -1);
    bool exits = false;
    for (const Inst &in : t.insts) exits = exits || in.op == Op::guard;
    std::set<int32_t> seen;
    for (int32_t k = 0; k < p.num_outputs && !exits && opt.extern_outputs; ++k) {
      int32_t v = t.outputs[k], slot = p.num_inputs + k;
      if (!seen.insert(v).second || p.output_alias[k].input >= 0) continue;  // (a repeat keeps its copy)
      if (op_info(t.insts[t.def[v]].op).kind != OpKind::EXTERN || !p.buffer_backed[v]) continue;
      p.output_extern_slot[k] = p.views[v].slot;
      for (auto &rs : roots_at)
        for (Root &r : rs)
          if (r.slot == slot && r.value == v) r.optional = true;
    }
  }

  // In-place writes are deferred to the end of the trace, except that the ones before a side
  // exit (a guard) are flushed just before it: the interpreter resuming at the exit must
  // find the inputs as eager left them at that point. After a flush, the written values are
  // read from the input memory; a later read of the contents a flushed write replaced (the old
  // input, or an inline expression of it) cannot be served and is refused.
  size_t flushed = 0;  // mutations [0, flushed) are scheduled

  // Writes that share a kernel: the accesses of its writes so far (slot, coefficients over its
  // domain; writes flagged), and the inline ops their values evaluate.
  struct MutationAccess {
    int32_t slot;
    std::vector<int64_t> coef;
    bool write;
  };
  std::vector<MutationAccess> group_access;
  int64_t group_cost = 0;
  bool group_closed = false;  // a write of it reads memory only the data names: it stays alone

  // Can write k join group g, the kernel of the writes scheduled just before it? The kernel
  // computes every value of an element before it stores any (KernelEmitter::emit_body), so one
  // kernel is the same as the writes in order when every slot any of them writes is read and
  // written at the same elements by all of them (each element read, then written, in one
  // iteration; two writes into one element land in order). Records k's accesses when it joins
  // (or when g is k's own new group).
  bool join_mutation(size_t k, int32_t g) {
    int32_t c = mutations[k];
    const Type &ty = t.types[c];
    if (g < 0 || p.groups[g].domain != ty.sizes) return false;
    const bool fresh = p.groups[g].roots.empty();
    if (!fresh && (group_closed || p.groups[g].roots.size() >= kMaxRoots)) return false;
    const Operand &from = t.insts[(size_t)t.def[c]].args[1];
    const bool inline_src = from.kind == Operand::Value && is_pointwise(from.value) && !p.materialized[from.value];
    const int64_t cost = 1 + (inline_src ? inline_ops[from.value] : 0);
    if (!fresh && group_cost + cost > kMaxInlineOps) return false;
    size_t rank = ty.sizes.size();
    Map id(rank);
    for (size_t d = 0; d < rank; ++d) id[d] = ty.sizes[d] == 1 ? -1 : (int32_t)d;
    std::vector<Access> reads;
    leaves(c, id, rank, reads);
    std::vector<MutationAccess> mine;
    bool hazard = false;
    for (Access &a : reads) {
      if (a.first < 0) {  // memory only the data names (a gather's source): never shares a kernel
        hazard = true;
        continue;
      }
      for (size_t d = 0; d < rank; ++d)
        if (ty.sizes[d] == 1) a.second[d] = 0;
      mine.push_back({a.first, std::move(a.second), false});
    }
    std::vector<int64_t> own(rank + 1, 0);
    for (size_t d = 0; d < rank; ++d)
      if (ty.sizes[d] != 1) own[d] = mutation_dest[k].strides[d];
    own[rank] = mutation_dest[k].offset;
    mine.push_back({mutation_dest[k].slot, own, true});
    if (!fresh) {
      auto clash = [](const std::vector<MutationAccess> &writes, const std::vector<MutationAccess> &any) {
        for (const MutationAccess &w : writes)
          if (w.write)
            for (const MutationAccess &a : any)
              if (a.slot == w.slot && a.coef != w.coef) return true;
        return false;
      };
      if (hazard || clash(group_access, mine) || clash(mine, group_access)) return false;
    }
    group_closed = group_closed || hazard;
    group_access.insert(group_access.end(), mine.begin(), mine.end());
    group_cost += cost;
    return true;
  }

  void schedule_mutations(size_t upto = SIZE_MAX) {
    int32_t g = -1;
    // At the end nothing reads the written memory again: a write that a later one replaces
    // exactly (same memory, same view, same shape) is not done (`x.copy_(a); x.copy_(b)`).
    std::vector<char> replaced(mutations.size(), 0);
    if (upto == SIZE_MAX) {
      std::map<std::tuple<int32_t, int64_t, std::vector<int64_t>, std::vector<int64_t>>, size_t> later;
      for (size_t k = mutations.size(); k-- > flushed;) {
        auto key = std::make_tuple(mutation_dest[k].slot, mutation_dest[k].offset, mutation_dest[k].strides,
                                   t.types[mutations[k]].sizes);
        replaced[k] = later.count(key) != 0;
        later[key] = k;
      }
    }
    for (size_t k = flushed; k < mutations.size() && k < upto; ++k) {
      if (replaced[k]) {
        flushed = k + 1;
        continue;
      }
      int32_t c = mutations[k];
      // At the end, writes over one domain share a kernel where that is the same as running
      // them one after another (join_mutation); else each has its own.
      if (upto != SIZE_MAX || !join_mutation(k, g)) {
        g = open_group(false, t.types[c].sizes, {});
        group_access.clear();
        group_cost = 0;
        group_closed = false;
        join_mutation(k, g);  // (records k's accesses and cost for the next write)
      }
      Root r{c, mutation_dest[k].slot};
      if (std::find(p.mutated_inputs.begin(), p.mutated_inputs.end(), r.slot) == p.mutated_inputs.end())
        p.mutated_inputs.push_back(r.slot);
      r.strided = true;
      r.dest = mutation_dest[k];
      p.groups[g].roots.push_back(r);
      if (upto != SIZE_MAX && !p.materialized[c]) {  // later reads load the written memory
        p.materialized[c] = 1;
        p.buffer_backed[c] = 1;
        p.views[c] = mutation_dest[k];
        p.group_of[c] = g;
      }
      flushed = k + 1;
    }
  }

  // Does reading value u after instruction `at` need memory of input slot s as it was before
  // the writes flushed at `at`? seen: values already answered "no" for this s and at (shared
  // by the calls of one check, so each value is walked once). Iterative: chains may be long.
  bool reads_old(int32_t u0, int32_t s, int32_t at, std::vector<char> &seen) {
    std::vector<int32_t> stack{u0};
    while (!stack.empty()) {
      int32_t u = stack.back();
      stack.pop_back();
      if (!t.types[u].tensor || seen[u]) continue;
      seen[u] = 1;
      const Inst &d = t.insts[t.def[u]];
      OpKind kind = op_info(d.op).kind;
      if (kind == OpKind::INPUT) {
        if (p.views[u].slot == s) return true;
        continue;
      }
      if (d.op == Op::copy_) {
        if (!flushed_value[u]) stack.push_back(d.args[1].value);
        continue;
      }
      if (kind == OpKind::VIEW) {
        stack.push_back(d.args[0].value);
        continue;
      }
      if (t.def[u] < at && (p.materialized[u] || kind == OpKind::EXTERN || kind == OpKind::REDUCTION)) continue;
      for (const Operand &o : d.args)
        if (o.kind == Operand::Value) stack.push_back(o.value);
    }
    return false;
  }
  std::vector<char> flushed_value;  // per value: a copy_ already written to its destination

  void flush_mutations_before(int32_t guard) {
    size_t first = flushed, upto = flushed;
    while (upto < mutations.size() && t.def[mutations[upto]] < guard) ++upto;
    if (upto == first) return;
    schedule_mutations(upto);
    flushed_value.resize(t.types.size(), 0);
    for (size_t k = first; k < upto; ++k) flushed_value[mutations[k]] = 1;
    std::set<int32_t> slots;
    for (size_t k = first; k < upto; ++k) slots.insert(mutation_dest[k].slot);
    for (int32_t s : slots) {
      std::vector<char> seen(t.types.size(), 0);
      for (size_t j = (size_t)guard; j < t.insts.size(); ++j)
        for (const Operand &o : t.insts[j].args)
          if (o.kind == Operand::Value && reads_old(o.value, s, guard, seen))
            fail(ErrorCode::Unsupported, "instruction " + std::to_string(j) + " reads the old contents of input " +
                                             std::to_string(s) + " after an in-place write into it and a side exit "
                                             "(guard); write the value to a fresh tensor first");
      for (int32_t v : t.outputs)
        if (t.def[v] >= guard && reads_old(v, s, guard, seen))
          fail(ErrorCode::Unsupported, "an output reads the old contents of input " + std::to_string(s) +
                                           " after an in-place write into it and a side exit");
    }
  }

  // The longest inline expression a loop after an extern recomputes rather than load.
  static constexpr int64_t kRecomputeOps = 3;
  // An inline expression this long is stored and its readers begin a new one: one loop body of
  // 10^5 ops made LLVM's machine scheduler (quadratic in a basic block) take 24 s; in 2048-op
  // pieces a 10^5-deep chain compiles in seconds.
  static constexpr int64_t kMaxInlineOps = 2048;
  // At most this many stores per loop: the vectorizer's runtime alias checks and the machine
  // scheduler are quadratic in the pointers of one loop (2,500 outputs of one kernel took 4 s).
  static constexpr size_t kMaxRoots = 64;

  void decide_materialization() {
    // next_extern[i]: the first extern instruction after instruction i (size(): none).
    std::vector<size_t> next_extern(t.insts.size() + 1, t.insts.size());
    for (size_t i = t.insts.size(); i-- > 0;)
      next_extern[i] = i + 1 < t.insts.size() && op_info(t.insts[i + 1].op).kind == OpKind::EXTERN ? i + 1
                                                                                                   : next_extern[i + 1];
    // inline_ops[v]: the pointwise ops a loop evaluates to recompute v inline (v and the inline
    // values it reads, counted once per read).
    // reads_written[v]: v's inline expression reads a trace input that a copy_ writes in place
    // (recomputed after the write, it would read the new contents).
    inline_ops.assign(t.types.size(), 0);
    std::vector<char> reads_written(t.types.size(), 0);
    std::vector<char> written(t.types.size(), 0);
    for (const Inst &in : t.insts)
      if (in.op == Op::copy_ && !in.args.empty() && in.args[0].kind == Operand::Value) {
        int32_t d = in.args[0].value;
        while (t.insts[(size_t)t.def[d]].op != Op::input && op_info(t.insts[(size_t)t.def[d]].op).kind == OpKind::VIEW)
          d = t.insts[(size_t)t.def[d]].args[0].value;  // a write through a view writes its base
        written[d] = 1;
      }
    for (size_t v = 0; v < t.types.size(); ++v) {
      if (!t.types[v].tensor || !is_computed((int32_t)v)) continue;
      bool m = false;
      const size_t boundary = next_extern[(size_t)t.def[v]];
      if (is_pointwise((int32_t)v)) {
        int64_t n = 1;
        for (const Operand &o : t.insts[(size_t)t.def[v]].args) {
          if (o.kind != Operand::Value) continue;
          if (written[o.value]) reads_written[v] = 1;
          if (p.materialized[o.value]) continue;
          n += inline_ops[o.value];
          reads_written[v] |= reads_written[o.value];
        }
        inline_ops[v] = std::min<int64_t>(n, 1 << 20);
      }
      for (auto [i, k] : users[v]) {
        const Inst &u = t.insts[i];
        OpKind kind = op_info(u.op).kind;
        if (kind == OpKind::EXTERN || kind == OpKind::VIEW || is_gather_source(u, (size_t)k)) m = true;
        if (is_pointwise((int32_t)v) && (kind == OpKind::POINTWISE || kind == OpKind::GATHER) &&
            t.types[u.results[0]].numel() != t.types[v].numel())
          m = true;
        // Read again past an extern: the loops after it would recompute v's whole expression,
        // and a value carried from step to step of an unrolled loop (an LSTM's cell state)
        // would grow its expression by one step each time (quadratic code and work). A short
        // expression (a few ops) is cheaper to recompute than to store and load.
        // Nor may one be recomputed from an input written in place meanwhile.
        if (is_pointwise((int32_t)v) && (size_t)i > boundary && (inline_ops[v] > kRecomputeOps || reads_written[v]))
          m = true;
      }
      if (is_pointwise((int32_t)v) && inline_ops[v] >= kMaxInlineOps && !users[v].empty()) m = true;
      p.materialized[v] = m;
    }
  }

  // Reductions found (by schedule) to be read outside their own row get a buffer and are
  // stored once per row by their group.
  void materialize_late() {
    for (size_t v = 0; v < t.types.size(); ++v) {
      if (!need_mat[v] || p.materialized[v]) continue;
      const Type &ty = t.types[v];
      int32_t s = new_slot(ty.numel() * dtype_bytes(ty.dtype));
      p.materialized[v] = 1;
      p.buffer_backed[v] = 1;
      p.views[v] = {s, 0, contiguous_strides(ty.sizes)};
      p.groups[p.group_of[v]].row_roots.push_back({(int32_t)v, s});
    }
  }

  void assign_buffers() {
    // Outputs: the first occurrence of a pointwise value writes straight into its output slot.
    std::vector<int32_t> out_slot(t.types.size(), -1);
    for (int32_t k = 0; k < p.num_outputs; ++k) {
      int32_t v = t.outputs[k], slot = p.num_inputs + k;
      if (is_computed(v) && out_slot[v] < 0 && t.insts[t.def[v]].op != Op::copy_) {
        out_slot[v] = slot;
        p.materialized[v] = 1;
      } else {
        roots_at[t.def[v]].push_back({v, slot});  // a copy into the output
      }
    }
    int32_t in_slot = 0;
    for (size_t i = 0; i < t.insts.size(); ++i) {
      const Inst &in = t.insts[i];
      const OpInfo &info = op_info(in.op);
      if (info.kind == OpKind::INPUT) {
        int32_t v = in.results[0];
        if (t.types[v].tensor) {
          const Type &ty = t.types[v];
          p.buffer_backed[v] = 1;
          p.views[v] = {in_slot, 0, ty.strides.empty() ? contiguous_strides(ty.sizes) : ty.strides};
        } else {
          p.scalar_slot[v] = in_slot;
        }
        ++in_slot;
      } else if (info.kind == OpKind::EXTERN) {
        for (int32_t r : in.results) {
          const Type &ty = t.types[r];
          int32_t s = new_slot(0);  // filled by the runtime with the result's data pointer
          p.buffer_backed[r] = 1;
          p.views[r] = {s, 0, contiguous_strides(ty.sizes)};
        }
      } else if (info.kind == OpKind::POINTWISE || info.kind == OpKind::GATHER || info.kind == OpKind::REDUCTION) {
        int32_t v = in.results[0];
        if (!p.materialized[v]) continue;
        const Type &ty = t.types[v];
        int32_t s = out_slot[v] >= 0 ? out_slot[v] : new_slot(ty.numel() * dtype_bytes(ty.dtype));
        p.buffer_backed[v] = 1;
        p.views[v] = {s, 0, contiguous_strides(ty.sizes)};
        if (info.kind != OpKind::REDUCTION) roots_at[i].insert(roots_at[i].begin(), Root{v, s});
      } else if (info.kind == OpKind::VIEW) {
        fold_view((int32_t)i);
      }
    }
  }

  // Computes the BufferView of a view instruction's result from its source's.
  void fold_view(int32_t i) {
    const Inst &in = t.insts[i];
    int32_t v = in.results[0], src = in.args[0].value;
    const Type &st = t.types[src];
    BufferView bv = p.views[src];
    std::vector<int64_t> &s = bv.strides;
    int64_t rank = st.rank();
    auto wrap = [&](int64_t d) { return d < 0 ? d + rank : d; };
    switch (in.op) {
      case Op::reshape:
      case Op::view: {
        std::vector<int64_t> ns;
        if (!reshape_strides(st.sizes, s, t.types[v].sizes, &ns)) {
          // Not expressible as strides: copy the source once, contiguously, then view that.
          if (copy_slot[src] < 0) {
            copy_slot[src] = new_slot(st.numel() * dtype_bytes(st.dtype));
            roots_at[i].insert(roots_at[i].begin(), Root{src, copy_slot[src]});  // before readers
          }
          bv = {copy_slot[src], 0, contiguous_strides(st.sizes)};
          if (!reshape_strides(st.sizes, bv.strides, t.types[v].sizes, &ns))
            fail(ErrorCode::Internal, "reshape of a contiguous copy has no strides");  // never: sizes verified
        }
        bv.strides = ns;
        break;
      }
      case Op::permute: {
        std::vector<int64_t> ns;
        for (int64_t d : in.args[1].list) ns.push_back(s[wrap(d)]);
        s = ns;
        break;
      }
      case Op::transpose:
        if (rank > 0) std::swap(s[wrap(in.args[1].i)], s[wrap(in.args[2].i)]);
        break;
      case Op::expand: {
        const auto &e = in.args[1].list;
        std::vector<int64_t> ns(e.size(), 0);
        size_t lead = e.size() - rank;
        for (size_t k = lead; k < e.size(); ++k)
          ns[k] = st.sizes[k - lead] == 1 && t.types[v].sizes[k] != 1 ? 0 : s[k - lead];
        s = ns;
        break;
      }
      case Op::squeeze: {
        std::vector<int64_t> ns;
        int64_t only = in.args.size() == 2 && rank > 0 ? wrap(in.args[1].i) : -1;
        for (int64_t k = 0; k < rank; ++k) {
          bool drop = st.sizes[k] == 1 && (only < 0 ? in.args.size() == 1 : k == only);
          if (!drop) ns.push_back(s[k]);
        }
        s = ns;
        break;
      }
      case Op::unsqueeze: {
        int64_t d = in.args[1].i;
        if (d < 0) d += rank + 1;
        s.insert(s.begin() + d, 0);
        break;
      }
      case Op::slice: {
        int64_t d = wrap(in.args[1].i), n = st.sizes[d], start = in.args[2].i;
        if (start < 0) start += n;
        start = std::clamp<int64_t>(start, 0, n);
        if (t.types[v].sizes[d] > 0) bv.offset += start * s[d];
        s[d] = t.types[v].sizes[d] > 1 ? s[d] * in.args[4].i : 0;  // a huge step keeps at most one element
        break;
      }
      case Op::select: {
        int64_t d = wrap(in.args[1].i), idx = in.args[2].i;
        if (idx < 0) idx += st.sizes[d];
        bv.offset += idx * s[d];
        s.erase(s.begin() + d);
        break;
      }
      case Op::as_strided: {
        // Strides count x's elements in row-major order: over a source laid out otherwise, a
        // contiguous copy of it first (as a reshape that strides cannot express).
        if (s != contiguous_strides(st.sizes)) {
          if (copy_slot[src] < 0) {
            copy_slot[src] = new_slot(st.numel() * dtype_bytes(st.dtype));
            roots_at[i].insert(roots_at[i].begin(), Root{src, copy_slot[src]});  // before readers
          }
          bv = {copy_slot[src], 0, contiguous_strides(st.sizes)};
        }
        bv.offset += in.args[3].i;
        bv.strides = in.args[2].list;
        break;
      }
      default:
        fail(ErrorCode::Internal, "fold_view: not a view op");
    }
    p.buffer_backed[v] = 1;
    p.views[v] = bv;
  }

  // Is value v computed (not loaded) when evaluated inside group g?
  bool computed_in(int32_t v, int32_t g) const {
    if (is_pointwise(v)) return !p.materialized[v] || p.group_of[v] == g;
    return is_reduction(v) && p.group_of[v] == g;
  }

  bool writes_slot(const Group &g, int32_t slot) const {
    for (const Root &r : g.roots) if (r.slot == slot) return true;
    for (const Root &r : g.row_roots) if (r.slot == slot) return true;
    return false;
  }

  // Walks v's inline expression as group g would evaluate it at map m. Returns false if g
  // cannot compute it: it would read through a buffer that g itself writes, or read one of
  // g's reductions somewhere other than the current row. Reductions of other groups that are
  // read are marked for materialization (when `mark`).
  bool can_compute(int32_t v0, const Map &m0, int32_t g, bool mark, bool is_root = false) {
    // An explicit stack, not recursion: a trace's chains can be 10^5 values deep. Operands are
    // pushed last-first, so they are walked in the order a recursive walk would take.
    struct Item {
      int32_t v;
      Map m;
      bool root;
    };
    std::vector<Item> work;
    work.push_back({v0, m0, is_root});
    while (!work.empty()) {
      Item it = std::move(work.back());
      work.pop_back();
      const int32_t v = it.v;
      bool walk;
      if (it.root && is_pointwise(v)) {  // the root itself is computed by g, whatever its buffer
        walk = true;
      } else if (is_reduction(v) && p.group_of[v] == g) {
        Map rm = row_map(p.groups[g], t.types[v].sizes);
        if (rm.empty() || rm != it.m) return false;  // only this row's register
        walk = false;
      } else if (is_pointwise(v) && computed_in(v, g)) {
        walk = true;
      } else {
        if (is_reduction(v) && mark) need_mat[v] = 1;
        if (p.buffer_backed[v] && g >= 0 && writes_slot(p.groups[g], p.views[v].slot)) return false;
        walk = false;
      }
      if (!walk) continue;
      const Inst &def = t.insts[t.def[v]];
      const std::vector<Operand> &args = def.args;
      for (size_t k = args.size(); k-- > 0;) {
        const Operand &o = args[k];
        if (is_gather_source(def, k)) {  // read from memory that must be complete before g runs
          int32_t x = o.value;
          if (g >= 0 && p.group_of[x] == g) return false;
          if (p.buffer_backed[x] && g >= 0 && writes_slot(p.groups[g], p.views[x].slot)) return false;
          if (is_reduction(x) && mark) need_mat[x] = 1;
          continue;
        }
        if (o.kind == Operand::Value && t.types[o.value].tensor) work.push_back({o.value, operand_map(t, v, k, it.m), false});
      }
    }
    return true;
  }

  Map identity(const std::vector<int64_t> &shape) const {
    Map m(shape.size());
    for (size_t k = 0; k < shape.size(); ++k) m[k] = shape[k] == 1 ? -1 : (int32_t)k;
    return m;
  }

  int32_t open_group(bool row, const std::vector<int64_t> &domain, const std::vector<int64_t> &rdims) {
    Group g;
    g.row = row;
    g.domain = domain;
    g.rdims = rdims;
    p.groups.push_back(g);
    p.steps.push_back({Step::Kernel, (int32_t)p.groups.size() - 1});
    return (int32_t)p.groups.size() - 1;
  }

  void add_reduction(int32_t r, int32_t &cur) {
    const Inst &in = t.insts[t.def[r]];
    const Type &x = t.types[in.args[0].value];
    ReduceInfo ri = reduce_info(t, in);
    bool join = cur >= 0 && p.groups[cur].row && p.groups[cur].optional_slot < 0 && p.groups[cur].domain == x.sizes &&
                p.groups[cur].rdims == ri.dims &&
                can_compute(in.args[0].value, identity(x.sizes), cur, false);
    if (!join) cur = open_group(true, x.sizes, ri.dims);
    can_compute(in.args[0].value, identity(x.sizes), cur, true);
    p.groups[cur].reductions.push_back(r);
    p.group_of[r] = cur;
    if (p.materialized[r]) p.groups[cur].row_roots.push_back({r, p.views[r].slot});
  }

  void add_root(const Root &r, int32_t &cur) {
    const Type &ty = t.types[r.value];
    bool as_row_root = false, join = false;
    Map m = identity(ty.sizes);
    if (r.optional || (cur >= 0 && p.groups[cur].optional_slot >= 0)) {
      // An elidable output copy runs in a kernel of its own.
    } else if (cur >= 0 && p.groups[cur].row) {
      const Group &g = p.groups[cur];
      if (g.domain == ty.sizes) {
        join = true;
      } else {
        Map rm = row_map(g, ty.sizes);
        if (!rm.empty()) { join = as_row_root = true; m = rm; }
      }
    } else if (cur >= 0) {
      join = p.groups[cur].domain == ty.sizes;
    }
    const int64_t cost = is_pointwise(r.value) ? inline_ops[r.value] : 1;
    if (join && (size_t)cur < group_ops.size() && group_ops[cur] + cost > kMaxInlineOps)
      join = as_row_root = false;  // one loop body stays short enough for LLVM (kMaxInlineOps)
    if (join && p.groups[cur].roots.size() + p.groups[cur].row_roots.size() >= kMaxRoots)
      join = as_row_root = false;  // and stores few enough pointers (kMaxRoots)
    if (join && !can_compute(r.value, m, cur, false, true)) join = as_row_root = false;
    if (!join) {
      cur = open_group(false, ty.sizes, {});
      m = identity(ty.sizes);
      if (r.optional) p.groups[cur].optional_slot = r.slot;
    }
    can_compute(r.value, m, cur, true, true);
    if (group_ops.size() <= (size_t)cur) group_ops.resize((size_t)cur + 1, 0);
    group_ops[cur] += cost;
    if (as_row_root) p.groups[cur].row_roots.push_back(r);
    else p.groups[cur].roots.push_back(r);
    if (is_pointwise(r.value) && p.materialized[r.value] && p.group_of[r.value] < 0) p.group_of[r.value] = cur;
  }

  void schedule() {
    int32_t cur = -1;
    for (size_t i = 0; i < t.insts.size(); ++i) {
      const Inst &in = t.insts[i];
      if (op_info(in.op).kind == OpKind::EXTERN) {
        cur = -1;
        if (in.op == Op::guard) flush_mutations_before((int32_t)i);
        add_extern((int32_t)i);
        for (const Operand &o : in.args)
          if (o.kind == Operand::Value && is_reduction(o.value)) need_mat[o.value] = 1;
      }
      if (op_info(in.op).kind == OpKind::REDUCTION) add_reduction(in.results[0], cur);
      for (const Root &r : roots_at[i]) add_root(r, cur);
    }
  }

  void add_extern(int32_t i) {
    const Inst &in = t.insts[i];
    ExternStep e;
    e.inst = i;
    e.is_exit = in.op == Op::guard;
    e.callee = e.is_exit ? "guard" : in.callee;
    auto arg_of = [&](const Operand &o) {
      ExternArg a;
      if (o.kind == Operand::Value && t.types[o.value].tensor) {
        a.is_tensor = true;
        a.value = o.value;
        a.view = p.views[o.value];
        if (!p.buffer_backed[o.value]) fail(ErrorCode::Internal, "extern operand is not in memory");
      } else if (o.kind == Operand::Value) {
        a.is_scalar_slot = true;
        a.value = o.value;
        a.slot = p.scalar_slot[o.value];
      } else {
        a.lit = o;
      }
      return a;
    };
    for (size_t k = 0; k < in.args.size(); ++k) {
      if (in.args[k].kind == Operand::TensorList) {  // one argument: the marker's elements
        ExternArg a;
        a.is_list = true;
        for (int64_t n = in.args[k].i; n > 0; --n) a.elems.push_back(arg_of(in.args[++k]));
        e.args.push_back(std::move(a));
        continue;
      }
      e.args.push_back(arg_of(in.args[k]));
    }
    for (int32_t r : in.results) {
      e.result_values.push_back(r);
      e.result_slots.push_back(p.views[r].slot);
    }
    p.externs.push_back(std::move(e));
    p.steps.push_back({Step::Extern, (int32_t)p.externs.size() - 1});
  }
};

}  // namespace

namespace {

// Extern ops whose results are not a function of their operands (random draws), or whose
// contents are unspecified: never kept.
bool random_extern(const std::string &callee) {
  static const char *const words[] = {"rand", "bernoulli", "dropout", "normal", "uniform", "multinomial",
                                      "exponential", "poisson", "cauchy", "geometric", "empty"};
  for (const char *w : words)
    if (callee.find(w) != std::string::npos) return true;
  return false;
}

// Plan::step_kept and what goes with it (see fuse.h).
void mark_kept_steps(const Trace &t, Plan &p) {
  const size_t nv = t.types.size();
  std::vector<char> mutated(t.inputs.size(), 0);
  for (int32_t s : p.mutated_inputs) mutated[(size_t)s] = 1;
  // A value computed from weights and constants alone, deterministically.
  std::vector<char> fixed(nv, 0);
  for (size_t i = 0; i < t.insts.size(); ++i) {
    const Inst &in = t.insts[i];
    bool f;
    if (in.op == Op::input) {
      f = false;
      for (size_t k = 0; k < t.inputs.size(); ++k)
        if (t.inputs[k] == in.results[0]) {
          const Type &ty = t.types[(size_t)in.results[0]];
          f = ty.tensor && ty.weight && !mutated[k];
        }
    } else if (in.op == Op::guard || in.op == Op::copy_) {
      f = false;
    } else {
      f = !(op_info(in.op).kind == OpKind::EXTERN && random_extern(in.callee));
      for (const Operand &o : in.args)
        if (o.kind == Operand::Value && !fixed[(size_t)o.value]) f = false;
    }
    for (int32_t r : in.results) fixed[(size_t)r] = f;
  }
  const int32_t first_scratch = p.num_inputs + p.num_outputs;
  std::vector<char> is_output(nv, 0);
  for (int32_t v : t.outputs) is_output[(size_t)v] = 1;
  std::vector<char> handed(p.num_slots, 0);
  for (int32_t s : p.output_extern_slot)
    if (s >= 0) handed[(size_t)s] = 1;
  std::vector<char> step_kept(p.steps.size(), 0), slot_kept(p.num_slots, 0);
  std::vector<int32_t> computed;  // the values of the kept steps
  bool any = false;
  for (size_t si = 0; si < p.steps.size(); ++si) {
    const Step &s = p.steps[si];
    std::vector<std::pair<int32_t, int32_t>> writes;  // (value, slot)
    if (s.kind == Step::Extern) {
      const ExternStep &e = p.externs[(size_t)s.index];
      if (e.is_exit) continue;
      for (size_t r = 0; r < e.result_values.size(); ++r) writes.push_back({e.result_values[r], e.result_slots[r]});
    } else {
      const Group &g = p.groups[(size_t)s.index];
      if (g.optional_slot >= 0) continue;
      bool strided = false;
      for (const Root &r : g.roots) {
        strided |= r.strided;
        writes.push_back({r.value, r.slot});
      }
      for (const Root &r : g.row_roots) {
        strided |= r.strided;
        writes.push_back({r.value, r.slot});
      }
      bool reductions_fixed = true;
      for (int32_t v : g.reductions) reductions_fixed &= fixed[(size_t)v] != 0;
      if (strided || !reductions_fixed) continue;
    }
    bool keep = !writes.empty();
    for (auto [v, slot] : writes)
      if (!fixed[(size_t)v] || is_output[(size_t)v] || slot < first_scratch || handed[(size_t)slot]) keep = false;
    if (!keep) continue;
    step_kept[si] = 1;
    any = true;
    for (auto [v, slot] : writes) {
      slot_kept[(size_t)slot] = 1;
      computed.push_back(v);
    }
  }
  if (!any) return;
  // The weights the kept steps read: the inputs their values come from.
  std::vector<char> seen(nv, 0);
  std::vector<int32_t> weights;
  while (!computed.empty()) {
    int32_t v = computed.back();
    computed.pop_back();
    if (seen[(size_t)v]) continue;
    seen[(size_t)v] = 1;
    const Inst &in = t.insts[(size_t)t.def[(size_t)v]];
    if (in.op == Op::input) {
      for (size_t k = 0; k < t.inputs.size(); ++k)
        if (t.inputs[k] == v) weights.push_back((int32_t)k);
      continue;
    }
    for (const Operand &o : in.args)
      if (o.kind == Operand::Value) computed.push_back(o.value);
  }
  std::sort(weights.begin(), weights.end());
  p.step_kept = std::move(step_kept);
  p.slot_kept = std::move(slot_kept);
  p.kept_weights = std::move(weights);
}

}  // namespace

Plan plan_trace(const Trace &t, const PlanOptions &opt) {
  Planner pl(t, opt);
  pl.run();
  if (opt.kept_steps) mark_kept_steps(t, pl.p);
  return std::move(pl.p);
}

std::vector<SideExit> side_exits(const Trace &t) {
  std::vector<SideExit> out;
  for (size_t i = 0; i < t.insts.size(); ++i) {
    const Inst &in = t.insts[i];
    if (in.op != Op::guard || in.args.size() < 3 || in.args[2].kind != Operand::Int || in.args[2].i < 0) continue;
    size_t id = (size_t)in.args[2].i;
    if (out.size() <= id) out.resize(id + 1);
    out[id] = SideExit{(int32_t)i, (int32_t)in.args.size() - 3};
  }
  return out;
}

}  // namespace dynamo::jit
