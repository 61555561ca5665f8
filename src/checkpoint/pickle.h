#pragma once
// Python's pickle, as far as PyTorch's checkpoints use it: the `.metadata` of a distributed checkpoint (DCP) and the
// `data.pkl` of each `torch.save` archive in its `.distcp` files. Internal to checkpoint/.
//
// The reader is a bounded one: it builds a tree of plain values and never calls anything. A class or function the
// pickle names (GLOBAL, STACK_GLOBAL) must be in the caller's list; REDUCE, NEWOBJ and BUILD only record which one
// was named with which arguments and state. A pickle naming anything else (`os.system`), or using an opcode these
// files never hold, is damage in one line: a forged file is refused, never run.
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::checkpoint {

struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kSet, kGlobal, kObject, kPersistentId };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  // kString, kBytes: the contents; kGlobal: "module.name"; kObject: the class or function that made it.
  std::string text;
  // kTuple, kList, kSet: the elements; kDict: key, value, key, value, ...; kObject: the arguments it was made with;
  // kPersistentId: the id.
  std::vector<const PickleValue*> items;
  const PickleValue* state = nullptr;  // kObject: what BUILD gave it (a dataclass's field dict, a tuple), or null

  bool is(Kind k) const { return kind == k; }
  // kDict: the value of the string key, or null.
  const PickleValue* get(std::string_view key) const;
  // kObject: its field `name` from a dict state, or null.
  const PickleValue* field(std::string_view name) const;
};

// What read_pickle returns: the root and every value under it, owned together.
class PickleDocument {
 public:
  const PickleValue& root() const { return *root_; }

 private:
  friend PickleDocument read_pickle(std::string_view, const std::set<std::string>&, const std::string&);
  std::deque<PickleValue> values_;
  const PickleValue* root_ = nullptr;
};

// Reads one pickle (protocols 2 to 5). `allowed_globals` lists the "module.name" it may name; `source` begins each
// error line (a file's path). Throws InvalidArgument on anything else: a truncated or malformed stream, an opcode
// outside the supported set, a name outside the list.
PickleDocument read_pickle(std::string_view bytes, const std::set<std::string>& allowed_globals,
                           const std::string& source);

// Writes a pickle of protocol 2, which every Python 3 and PyTorch reads, as a stack machine: each call emits one
// opcode, in the order Python's own pickler would for the same objects.
class PickleWriter {
 public:
  PickleWriter();
  void none();
  void boolean(bool value);
  void integer(int64_t value);
  void real(double value);
  void string(std::string_view value);
  void global(std::string_view module, std::string_view name);
  void mark();
  void tuple_from_mark();
  void tuple(int count);  // the top `count` (0 to 3) values
  void empty_list();
  void empty_dict();
  void appends_from_mark();
  void setitems_from_mark();
  void reduce();          // callable, args -> callable(*args)
  void newobj();          // class, args -> class.__new__(class, *args)
  void build();           // object, state -> object with that state
  void persistent_id();   // id -> persistent_load(id)
  // Ends the pickle and returns its bytes.
  std::string finish();

 private:
  std::string out_;
};

}  // namespace tandem::checkpoint
