// Bounded memory for any number of metrics lines: a curve keeps at most a fixed number of points and a heatmap at
// most a fixed number of columns however many lines are added, and neither needs to know how many will come (a
// run in progress, a file of 10^6 lines). Not here: which fields are plotted (launch/sweep/report_run.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launch/sweep/report_svg.h"

namespace moe::report {

// A curve has at most kMaxPoints points and a heatmap at most kMaxColumns columns: a run of any length makes a page
// of bounded size (a run with a line per step: about 0.8 MB, for 10,000 steps as for 200,000).
inline constexpr size_t kMaxPoints = 1000;
inline constexpr size_t kMaxColumns = 150;

// A curve of at most `most` points: the points are gathered in buckets of equal counts of consecutive points (the
// count doubling, neighbours merged, whenever there are too many buckets), each bucket keeping its lowest and its
// highest point, so a spike is never thinned away; the first and the last point are always kept. Up to `most`
// points, every point is kept.
class SeriesSampler {
 public:
  explicit SeriesSampler(size_t most);
  void add(double x, double y);
  uint64_t added() const { return added_; }
  // The kept points in the order they were added.
  Series series(const std::string& name) const;

 private:
  struct Point {
    double x, y;
    uint64_t index;  // order of arrival
  };
  struct Bucket {
    Point lo, hi;
    uint64_t n;
  };
  void merge_neighbours();

  size_t max_buckets_;
  uint64_t per_bucket_ = 1, added_ = 0;
  std::vector<Bucket> buckets_;
  Point first_{}, last_{};
};

// A heatmap's columns over consecutive lines, each line a vector of values (a row each): each column is the mean
// of its lines; at most `most` columns, and at most `most_cells` values in all (fewer columns for many rows).
class ColumnMeans {
 public:
  ColumnMeans(size_t most, size_t most_cells);
  void add(double step, const std::vector<double>& values);
  size_t rows() const { return rows_; }
  struct Column {
    std::vector<double> sum;  // per row; a line with fewer values counts 0 for the rest
    uint64_t n;               // lines
    double last_step;         // the column's label
  };
  // The columns, each the mean of its lines' values.
  std::vector<Column> columns() const;

 private:
  size_t limit() const;  // the columns allowed for the rows seen so far
  size_t most_, most_cells_, rows_ = 0;
  uint64_t per_column_ = 1;
  std::vector<Column> columns_;  // up to twice limit(), merged to limit() when asked for
};

}  // namespace moe::report
