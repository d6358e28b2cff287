// MemoryAccountant and MemoryRecord; see memory_accountant.h.
#include "memory/memory_accountant.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"

namespace layup {

void MemoryAccountant::grow(MemoryUsage& usage, size_t bytes) {
  usage.current += bytes;
  usage.peak = std::max(usage.peak, usage.current);
}

void MemoryAccountant::add(MemorySide side, TensorClass tensor_class, MemoryKind kind,
                           size_t bytes) {
  const int s = index_of(side), c = index_of(tensor_class), k = index_of(kind);
  std::lock_guard lock(mutex_);
  grow(cells_[s][c][k], bytes);
  grow(rows_[s][c], bytes);
  grow(sides_[s], bytes);
  grow(total_, bytes);
}

void MemoryAccountant::remove(MemorySide side, TensorClass tensor_class, MemoryKind kind,
                              size_t bytes) noexcept {
  const int s = index_of(side), c = index_of(tensor_class), k = index_of(kind);
  std::lock_guard lock(mutex_);
  auto shrink = [bytes](MemoryUsage& usage) { usage.current -= std::min(usage.current, bytes); };
  shrink(cells_[s][c][k]);
  shrink(rows_[s][c]);
  shrink(sides_[s]);
  shrink(total_);
}

MemoryUsage MemoryAccountant::cell(MemorySide side, TensorClass tensor_class,
                                   MemoryKind kind) const {
  std::lock_guard lock(mutex_);
  return cells_[index_of(side)][index_of(tensor_class)][index_of(kind)];
}

MemoryUsage MemoryAccountant::row(MemorySide side, TensorClass tensor_class) const {
  std::lock_guard lock(mutex_);
  return rows_[index_of(side)][index_of(tensor_class)];
}

MemoryUsage MemoryAccountant::side_total(MemorySide side) const {
  std::lock_guard lock(mutex_);
  return sides_[index_of(side)];
}

MemoryUsage MemoryAccountant::total() const {
  std::lock_guard lock(mutex_);
  return total_;
}

std::string MemoryAccountant::report() const {
  std::lock_guard lock(mutex_);
  // Only the kinds that ever held memory get a column.
  std::vector<MemoryKind> kinds;
  for (MemoryKind kind : kAllMemoryKinds) {
    bool used = false;
    for (MemorySide side : kAllMemorySides)
      for (TensorClass c : kAllTensorClasses)
        used = used || cells_[index_of(side)][index_of(c)][index_of(kind)].peak > 0;
    if (used) kinds.push_back(kind);
  }
  std::string text;
  char field[64];
  auto line = [&](const std::string& label, const std::vector<std::string>& columns) {
    std::snprintf(field, sizeof field, "  %-22s", label.c_str());
    text += field;
    for (const std::string& column : columns) {
      std::snprintf(field, sizeof field, " %12s", column.c_str());
      text += field;
    }
    text += "\n";
  };
  auto bytes_or_dash = [](size_t bytes) { return bytes ? format_bytes(bytes) : std::string("-"); };

  std::vector<std::string> header;
  for (MemoryKind kind : kinds) header.push_back(memory_kind_name(kind));
  header.push_back("peak");
  line("", header);
  for (MemorySide side : kAllMemorySides) {
    const int s = index_of(side);
    if (sides_[s].peak == 0) continue;
    text += std::string("  ") + memory_side_name(side) + "\n";
    for (TensorClass c : kAllTensorClasses) {
      if (rows_[s][index_of(c)].peak == 0) continue;
      std::vector<std::string> columns;
      for (MemoryKind kind : kinds)
        columns.push_back(bytes_or_dash(cells_[s][index_of(c)][index_of(kind)].current));
      columns.push_back(bytes_or_dash(rows_[s][index_of(c)].peak));
      line(std::string("  ") + tensor_class_label(c), columns);
    }
    std::vector<std::string> totals(kinds.size());
    for (size_t i = 0; i < kinds.size(); ++i) {
      size_t bytes = 0;
      for (TensorClass c : kAllTensorClasses)
        bytes += cells_[s][index_of(c)][index_of(kinds[i])].current;
      totals[i] = bytes_or_dash(bytes);
    }
    totals.push_back(bytes_or_dash(sides_[s].peak));
    line(std::string("  total ") + (side == MemorySide::kDevice ? "device" : "host"), totals);
  }
  std::vector<std::string> all(kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) {
    size_t bytes = 0;
    for (MemorySide side : kAllMemorySides)
      for (TensorClass c : kAllTensorClasses)
        bytes += cells_[index_of(side)][index_of(c)][index_of(kinds[i])].current;
    all[i] = bytes_or_dash(bytes);
  }
  all.push_back(bytes_or_dash(total_.peak));
  line("total", all);
  return text;
}

std::vector<MemoryCell> MemoryAccountant::cells() const {
  std::lock_guard lock(mutex_);
  return cells_locked();
}

std::vector<MemoryCell> MemoryAccountant::cells_locked() const {
  std::vector<MemoryCell> held;
  for (MemorySide side : kAllMemorySides)
    for (TensorClass c : kAllTensorClasses)
      for (MemoryKind kind : kAllMemoryKinds) {
        const MemoryUsage& usage = cells_[index_of(side)][index_of(c)][index_of(kind)];
        if (usage.peak > 0) held.push_back({side, c, kind, usage});
      }
  return held;
}

std::string MemoryAccountant::to_json_text() const {
  auto usage_json = [](const MemoryUsage& usage) {
    return nlohmann::json{{"current_bytes", usage.current}, {"peak_bytes", usage.peak}};
  };
  // One snapshot under one lock, so that the totals are the sums of the cells beside them.
  std::lock_guard lock(mutex_);
  nlohmann::json cells = nlohmann::json::array();
  for (const MemoryCell& held : cells_locked()) {
    nlohmann::json cell = usage_json(held.usage);
    cell["side"] = held.side == MemorySide::kDevice ? "device" : "host";
    cell["class"] = tensor_class_name(held.tensor_class);
    cell["kind"] = memory_kind_name(held.kind);
    cells.push_back(std::move(cell));
  }
  return nlohmann::json({{"cells", std::move(cells)},
                         {"device_side", usage_json(sides_[index_of(MemorySide::kDevice)])},
                         {"host_side", usage_json(sides_[index_of(MemorySide::kHost)])},
                         {"total", usage_json(total_)}})
      .dump();
}

MemoryRecord::MemoryRecord(std::shared_ptr<MemoryAccountant> accountant, MemorySide side,
                           TensorClass tensor_class, MemoryKind kind, size_t bytes)
    : accountant_(std::move(accountant)),
      side_(side),
      class_(tensor_class),
      kind_(kind),
      bytes_(bytes) {
  if (accountant_) accountant_->add(side_, class_, kind_, bytes_);
}

MemoryRecord& MemoryRecord::operator=(MemoryRecord&& other) noexcept {
  if (this != &other) {
    reset();
    accountant_ = std::move(other.accountant_);
    side_ = other.side_;
    class_ = other.class_;
    kind_ = other.kind_;
    bytes_ = other.bytes_;
    other.accountant_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void MemoryRecord::reset() noexcept {
  if (accountant_) accountant_->remove(side_, class_, kind_, bytes_);
  accountant_ = nullptr;
  bytes_ = 0;
}

std::string format_bytes(size_t bytes) {
  char text[32];
  const double value = static_cast<double>(bytes);
  if (bytes >= (size_t{1} << 30))
    std::snprintf(text, sizeof text, "%.2f GiB", value / (1 << 30));
  else if (bytes >= (size_t{1} << 20))
    std::snprintf(text, sizeof text, "%.1f MiB", value / (1 << 20));
  else if (bytes >= (size_t{1} << 10))
    std::snprintf(text, sizeof text, "%.1f KiB", value / (1 << 10));
  else
    std::snprintf(text, sizeof text, "%zu B", bytes);
  return text;
}

}  // namespace layup
