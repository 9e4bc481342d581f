// The index of a tier that keeps chunks under a byte budget (DRAM, disk): key -> the tier's entry, the least
// recently used evicted first, and read pins that keep an entry out of eviction while its bytes are copied
// outside the lock. The index does not lock itself: the tier's mutex guards it together with whatever the tier
// keeps beside it (the disk tier's file names), and a pin takes that mutex when it lets go. An owner declares its
// index ABSL_GUARDED_BY its mutex, so clang checks every use of it (scripts/check-thread-safety).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"
#include "keys/namespace.h"

namespace cake {

template <typename Value>
class LruIndex {
 public:
  explicit LruIndex(Mutex& owner_mu) : mu_(owner_mu) {}
  LruIndex(const LruIndex&) = delete;
  LruIndex& operator=(const LruIndex&) = delete;

  // Keeps one entry from eviction until it goes (or Release). Taken and checked under the owner's mutex; its
  // release takes the mutex itself, so a reader lets go after its unlocked copy without further ceremony. An
  // entry removed meanwhile (and perhaps indexed again since) is simply not pinned any more.
  class ReadPin {
   public:
    ReadPin() = default;
    ReadPin(ReadPin&& other) noexcept { *this = std::move(other); }
    ReadPin& operator=(ReadPin&& other) noexcept {
      if (this != &other) {
        Release();
        index_ = std::exchange(other.index_, nullptr);
        key_ = other.key_;
        generation_ = other.generation_;
      }
      return *this;
    }
    ReadPin(const ReadPin&) = delete;
    ReadPin& operator=(const ReadPin&) = delete;
    ~ReadPin() { Release(); }

    // Requires the owner's mutex NOT held.
    void Release() {
      if (index_ == nullptr) return;
      MutexLock lock(&index_->mu_);
      ReleaseLocked();
    }
    // The same, with the owner's mutex held.
    void ReleaseLocked() {
      if (index_ == nullptr) return;
      if (Node* node = index_->FindCurrent(key_, generation_)) --node->readers;
      index_ = nullptr;
    }
    // Requires the owner's mutex: the pinned entry is still the one indexed under its key.
    bool current() const { return index_ != nullptr && index_->FindCurrent(key_, generation_) != nullptr; }
    const ChunkKey& key() const { return key_; }

   private:
    friend class LruIndex;
    LruIndex* index_ = nullptr;
    ChunkKey key_;
    uint64_t generation_ = 0;
  };

  // Everything below requires the owner's mutex.

  bool Contains(const ChunkKey& key) const { return nodes_.contains(key); }
  // The entry under `key` is the one `generation` names (Insert's answer).
  bool Current(const ChunkKey& key, uint64_t generation) const { return FindCurrent(key, generation) != nullptr; }
  size_t size() const { return nodes_.size(); }

  // The entry, without counting as a use; nullptr when absent. Valid until the index next changes.
  Value* Find(const ChunkKey& key) {
    auto it = nodes_.find(key);
    return it == nodes_.end() ? nullptr : &it->second.value;
  }
  // The same, marking it the most recently used.
  Value* Touch(const ChunkKey& key) {
    auto it = nodes_.find(key);
    if (it == nodes_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second.lru_position);
    return &it->second.value;
  }
  // Touches the entry and pins it for a read; nullopt when absent.
  std::optional<ReadPin> PinForRead(const ChunkKey& key) {
    auto it = nodes_.find(key);
    if (it == nodes_.end()) return std::nullopt;
    lru_.splice(lru_.begin(), lru_, it->second.lru_position);
    ++it->second.readers;
    ReadPin pin;
    pin.index_ = this;
    pin.key_ = key;
    pin.generation_ = it->second.generation;
    return pin;
  }

  // Indexes a new entry as the most recently used; returns its generation, which names this very entry (a
  // later one under the same key gets another), or nullopt when the key is indexed already.
  std::optional<uint64_t> Insert(const ChunkKey& key, Value value) {
    if (nodes_.contains(key)) return std::nullopt;
    lru_.push_front(key);
    const uint64_t generation = next_generation_++;
    nodes_.emplace(key, Node{std::move(value), lru_.begin(), 0, generation});
    return generation;
  }
  // Removes the entry whatever its pins (their readers finish on what they hold); false when absent.
  bool Erase(const ChunkKey& key) {
    auto it = nodes_.find(key);
    if (it == nodes_.end()) return false;
    lru_.erase(it->second.lru_position);
    nodes_.erase(it);
    return true;
  }
  // Evicts unpinned entries, coldest first, until `has_room()` holds; `on_evict(key, value)` runs for each just
  // before it goes (the owner counts and accounts for it there). Returns has_room(): false when every entry left
  // is pinned.
  template <typename HasRoom, typename OnEvict>
  bool EvictUntil(HasRoom&& has_room, OnEvict&& on_evict) {
    auto victim = lru_.end();
    while (!has_room()) {
      if (victim == lru_.begin()) return false;
      --victim;
      auto it = nodes_.find(*victim);
      if (it->second.readers > 0) continue;
      on_evict(it->first, it->second.value);
      victim = lru_.erase(victim);
      nodes_.erase(it);
    }
    return true;
  }
  void ForEach(const std::function<void(const ChunkKey&, const Value&)>& fn) const {
    for (const auto& [key, node] : nodes_) fn(key, node.value);
  }
  // In recency order, the least recently used first: the order in which Insert rebuilds the same list.
  void ForEachLeastRecentFirst(const std::function<void(const ChunkKey&, const Value&)>& fn) const {
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) fn(*it, nodes_.find(*it)->second.value);
  }

 private:
  struct Node {
    Value value;
    std::list<ChunkKey>::iterator lru_position;
    int readers = 0;
    uint64_t generation = 0;
  };
  Node* FindCurrent(const ChunkKey& key, uint64_t generation) {
    auto it = nodes_.find(key);
    return it == nodes_.end() || it->second.generation != generation ? nullptr : &it->second;
  }
  const Node* FindCurrent(const ChunkKey& key, uint64_t generation) const {
    auto it = nodes_.find(key);
    return it == nodes_.end() || it->second.generation != generation ? nullptr : &it->second;
  }

  Mutex& mu_;
  absl::flat_hash_map<ChunkKey, Node> nodes_;
  std::list<ChunkKey> lru_;  // front: most recently used
  uint64_t next_generation_ = 1;
};

}  // namespace cake
