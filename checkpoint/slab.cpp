// Hyperslab-with-range geometry and its N-dimensional intersection.
#include "checkpoint/slab.h"

#include <algorithm>
#include <sstream>

namespace moe::ckpt {
namespace {

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t d : v) n *= d;
  return n;
}

// The axes of a pair of slabs, with a scalar as one axis of one element.
struct Axes {
  std::vector<int64_t> a_start, a_shape, b_start, b_shape, lo, hi;
};

// The box both hyperslabs share; false when it is empty.
bool common_box(const Slab& a, const Slab& b, Axes* x) {
  const size_t n = a.global_shape.size();
  if (n == 0) {
    *x = {{0}, {1}, {0}, {1}, {0}, {1}};
    return true;
  }
  *x = {a.start, a.shape, b.start, b.shape, std::vector<int64_t>(n), std::vector<int64_t>(n)};
  for (size_t k = 0; k < n; ++k) {
    x->lo[k] = std::max(a.start[k], b.start[k]);
    x->hi[k] = std::min(a.start[k] + a.shape[k], b.start[k] + b.shape[k]);
    if (x->hi[k] <= x->lo[k]) return false;
  }
  return true;
}

// Trailing axes that the box covers whole in both slabs are merged into the axis before them: the
// row-major order of both is then linear across them (a whole tensor becomes one axis).
void collapse(Axes* x) {
  while (x->lo.size() > 1) {
    const size_t k = x->lo.size() - 1;
    const int64_t e = x->hi[k] - x->lo[k];
    const bool full =
        x->a_start[k] == x->lo[k] && x->b_start[k] == x->lo[k] && x->a_shape[k] == e && x->b_shape[k] == e;
    if (!full) return;
    for (auto* v : {&x->a_start, &x->b_start, &x->lo}) (*v)[k - 1] *= e, v->pop_back();
    for (auto* v : {&x->a_shape, &x->b_shape, &x->hi}) (*v)[k - 1] *= e, v->pop_back();
  }
}

std::vector<int64_t> strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

}  // namespace

Slab Slab::whole(const std::vector<int64_t>& g) { return {g, std::vector<int64_t>(g.size(), 0), g, 0, product(g)}; }

Slab Slab::flat(const std::vector<int64_t>& g, int64_t flat_offset, int64_t count) {
  Slab s = whole(g);
  s.begin = flat_offset, s.count = count;
  return s;
}

Slab Slab::box(const std::vector<int64_t>& g, const std::vector<int64_t>& start, const std::vector<int64_t>& shape) {
  return {g, start, shape, 0, product(shape)};
}

bool Slab::whole_box() const { return begin == 0 && count == product(shape); }

std::vector<int64_t> Slab::stored_shape() const { return whole_box() ? shape : std::vector<int64_t>{count}; }

int64_t Slab::first_global_index() const {
  if (count == 0 || global_shape.empty()) return 0;
  // The range's first element, unravelled in the hyperslab and placed in the tensor.
  const std::vector<int64_t> local = strides(shape), global = strides(global_shape);
  int64_t rest = begin, index = 0;
  for (size_t k = 0; k < shape.size(); ++k) {
    index += (start[k] + rest / local[k]) * global[k];
    rest %= local[k];
  }
  return index;
}

Slab Slab::in_words(int64_t words) const {
  if (words == 1) return *this;
  Slab s = *this;
  for (auto* v : {&s.global_shape, &s.shape}) v->push_back(words);
  s.start.push_back(0);
  s.begin *= words, s.count *= words;
  return s;
}

std::string Slab::problem() const {
  const size_t n = global_shape.size();
  if (start.size() != n || shape.size() != n) return "its start and shape do not have one entry per axis";
  for (size_t k = 0; k < n; ++k)
    if (global_shape[k] < 0 || start[k] < 0 || shape[k] < 0 || start[k] > global_shape[k] ||
        shape[k] > global_shape[k] - start[k])
      return "its box is outside the tensor on axis " + std::to_string(k);
  const int64_t m = product(shape);
  if (begin < 0 || count < 0 || begin > m || count > m - begin) return "its range is outside its box";
  return "";
}

std::string Slab::text() const {
  std::ostringstream out;
  out << "[";
  for (size_t k = 0; k < shape.size(); ++k) out << (k ? ", " : "") << start[k] << ":" << start[k] + shape[k];
  out << "] of [";
  for (size_t k = 0; k < global_shape.size(); ++k) out << (k ? "," : "") << global_shape[k];
  out << "], elements [" << begin << ", +" << count << ")";
  return out.str();
}

bool Slab::operator==(const Slab& o) const {
  return global_shape == o.global_shape && start == o.start && shape == o.shape && begin == o.begin && count == o.count;
}

std::vector<Run> intersect(const Slab& a, const Slab& b) {
  std::vector<Run> runs;
  Axes x;
  if (a.count == 0 || b.count == 0 || !common_box(a, b, &x)) return runs;
  collapse(&x);
  const size_t n = x.lo.size(), last = n - 1;
  const std::vector<int64_t> sa = strides(x.a_shape), sb = strides(x.b_shape);
  const int64_t length = x.hi[last] - x.lo[last];
  std::vector<int64_t> i(x.lo.begin(), x.lo.end());  // the row: every axis but the last
  while (true) {
    int64_t ia = 0, ib = 0;
    for (size_t k = 0; k < n; ++k) ia += (i[k] - x.a_start[k]) * sa[k], ib += (i[k] - x.b_start[k]) * sb[k];
    // Of the row's elements t in [0, length): those inside both ranges.
    const int64_t t0 = std::max({int64_t{0}, a.begin - ia, b.begin - ib});
    const int64_t t1 = std::min({length, a.begin + a.count - ia, b.begin + b.count - ib});
    if (t1 > t0) {
      const Run r{ia + t0 - a.begin, ib + t0 - b.begin, t1 - t0};
      if (!runs.empty() && runs.back().to + runs.back().length == r.to &&
          runs.back().from + runs.back().length == r.from)
        runs.back().length += r.length;
      else
        runs.push_back(r);
    }
    if (ia + length - a.begin >= a.count) break;  // rows go on in a's order: the rest is past its range
    size_t k = last;
    while (k-- > 0 && ++i[k] == x.hi[k]) i[k] = x.lo[k];
    if (k == size_t(-1)) break;
  }
  return runs;
}

int64_t overlap(const Slab& a, const Slab& b) {
  int64_t n = 0;
  for (const Run& r : intersect(a, b)) n += r.length;
  return n;
}

}  // namespace moe::ckpt
