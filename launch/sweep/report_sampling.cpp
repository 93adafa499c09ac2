// Curves and heatmap columns in bounded memory (launch/sweep/report_sampling.h).
#include "launch/sweep/report_sampling.h"

#include <algorithm>

namespace moe::report {

SeriesSampler::SeriesSampler(size_t most) : max_buckets_(std::max<size_t>(1, (std::max<size_t>(most, 4) - 2) / 2)) {}

void SeriesSampler::add(double x, double y) {
  const Point p{x, y, added_++};
  if (p.index == 0) first_ = p;
  last_ = p;
  if (!buckets_.empty() && buckets_.back().n < per_bucket_) {
    Bucket& b = buckets_.back();
    if (y < b.lo.y) b.lo = p;
    if (y > b.hi.y) b.hi = p;
    ++b.n;
    return;
  }
  buckets_.push_back({p, p, 1});
  if (buckets_.size() > max_buckets_) merge_neighbours();
}

void SeriesSampler::merge_neighbours() {
  std::vector<Bucket> merged;
  for (size_t i = 0; i < buckets_.size(); i += 2) {
    Bucket b = buckets_[i];
    if (i + 1 < buckets_.size()) {
      const Bucket& c = buckets_[i + 1];
      if (c.lo.y < b.lo.y) b.lo = c.lo;
      if (c.hi.y > b.hi.y) b.hi = c.hi;
      b.n += c.n;
    }
    merged.push_back(b);
  }
  buckets_ = std::move(merged);
  per_bucket_ *= 2;
}

Series SeriesSampler::series(const std::string& name) const {
  std::vector<Point> kept;
  if (added_ > 0) kept.push_back(first_);
  for (const Bucket& b : buckets_) {
    const Point& a = b.lo.index < b.hi.index ? b.lo : b.hi;
    const Point& z = b.lo.index < b.hi.index ? b.hi : b.lo;
    for (const Point* p : {&a, &z})
      if (kept.back().index < p->index) kept.push_back(*p);
  }
  if (added_ > 0 && kept.back().index < last_.index) kept.push_back(last_);
  Series s{name, {}, {}};
  for (const Point& p : kept) s.x.push_back(p.x), s.y.push_back(p.y);
  return s;
}

ColumnMeans::ColumnMeans(size_t most, size_t most_cells) : most_(std::max<size_t>(most, 1)), most_cells_(most_cells) {}

size_t ColumnMeans::limit() const { return std::clamp<size_t>(most_cells_ / std::max<size_t>(rows_, 1), 1, most_); }

void ColumnMeans::add(double step, const std::vector<double>& values) {
  rows_ = std::max(rows_, values.size());
  if (columns_.empty() || columns_.back().n >= per_column_) columns_.push_back({{}, 0, step});
  Column& c = columns_.back();
  if (c.sum.size() < values.size()) c.sum.resize(values.size(), 0.0);
  for (size_t r = 0; r < values.size(); ++r) c.sum[r] += values[r];
  ++c.n;
  c.last_step = step;
  // Twice the columns shown are kept, so that the columns shown are evenly filled after a merge.
  while (columns_.size() > 2 * limit()) {
    std::vector<Column> merged;
    for (size_t i = 0; i < columns_.size(); i += 2) {
      Column m = columns_[i];
      if (i + 1 < columns_.size()) {
        const Column& d = columns_[i + 1];
        if (m.sum.size() < d.sum.size()) m.sum.resize(d.sum.size(), 0.0);
        for (size_t r = 0; r < d.sum.size(); ++r) m.sum[r] += d.sum[r];
        m.n += d.n, m.last_step = d.last_step;
      }
      merged.push_back(std::move(m));
    }
    columns_ = std::move(merged);
    per_column_ *= 2;
  }
}

std::vector<ColumnMeans::Column> ColumnMeans::columns() const {
  const size_t kept = columns_.size(), shown = std::min(kept, limit());
  std::vector<Column> out;
  for (size_t c = 0; c < shown; ++c) {
    Column m{std::vector<double>(rows_, 0.0), 0, 0.0};
    for (size_t i = c * kept / shown; i < (c + 1) * kept / shown; ++i) {
      for (size_t r = 0; r < columns_[i].sum.size(); ++r) m.sum[r] += columns_[i].sum[r];
      m.n += columns_[i].n, m.last_step = columns_[i].last_step;
    }
    for (double& v : m.sum) v /= double(m.n);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace moe::report
