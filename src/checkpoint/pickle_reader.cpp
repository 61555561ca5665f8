// The bounded pickle reader (pickle.h): every opcode PyTorch's checkpoints use, each argument checked against the
// bytes left, values in one arena so that a pickle whose memo refers back to an open list cannot leak or loop.
#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

#include "pickle.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {

const PickleValue* PickleValue::get(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (size_t i = 0; i + 1 < items.size(); i += 2) {
    if (items[i]->kind == Kind::kString && items[i]->text == key) return items[i + 1];
  }
  return nullptr;
}

const PickleValue* PickleValue::field(std::string_view name) const {
  return kind == Kind::kObject && state != nullptr ? state->get(name) : nullptr;
}

namespace {

using PickleKind = PickleValue::Kind;

class PickleStream {
 public:
  PickleStream(std::string_view bytes, const std::set<std::string>& allowed, const std::string& source,
         std::deque<PickleValue>& values)
      : bytes_(bytes), allowed_(allowed), source_(source), values_(values) {}

  const PickleValue* run() {
    while (true) {
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') break;
      step(op);
    }
    if (stack_.size() != 1 || !marks_.empty()) damaged("it ends with an unbalanced stack");
    return stack_.back();
  }

 private:
  [[noreturn]] void damaged(const std::string& what) const {
    throw InvalidArgument(fmt::format("{}: not a pickle of a PyTorch checkpoint: {} (at byte {})", source_, what,
                                      position_));
  }

  std::string_view take(uint64_t count) {
    if (count > bytes_.size() - position_) damaged("it is cut short");
    const std::string_view part = bytes_.substr(position_, count);
    position_ += count;
    return part;
  }
  uint64_t little_endian(int width) {
    const std::string_view raw = take(width);
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(raw[i]);
    return value;
  }
  std::string line() {
    const size_t end = bytes_.find('\n', position_);
    if (end == std::string_view::npos) damaged("a GLOBAL's name has no end");
    std::string text(bytes_.substr(position_, end - position_));
    position_ = end + 1;
    return text;
  }

  // Every element a container or object gets counts against a budget of a few per byte of input: REDUCE copies
  // its arguments, and a forged pickle that reduced one long tuple from its memo again and again would otherwise
  // ask for memory quadratic in its size.
  void count_items(size_t added) {
    items_ += added;
    if (items_ > 8 * bytes_.size() + 1024) damaged("it holds more elements than its bytes can account for");
  }

  PickleValue* make(PickleKind kind) {
    values_.emplace_back();
    values_.back().kind = kind;
    return &values_.back();
  }
  void push(PickleValue* value) { stack_.push_back(value); }
  // Values below the newest mark are out of reach until it is closed, as in Python's own unpickler.
  PickleValue* top() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) damaged("an opcode takes from an empty stack");
    return stack_.back();
  }
  PickleValue* pop() {
    PickleValue* value = top();
    stack_.pop_back();
    return value;
  }
  // The values above the newest mark, which is removed.
  std::vector<PickleValue*> pop_mark() {
    if (marks_.empty()) damaged("an opcode needs a MARK that is not there");
    std::vector<PickleValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  PickleValue* container(PickleKind kind, const char* opcode) {
    PickleValue* target = top();
    if (target->kind != kind) damaged(fmt::format("{} applies to something that is not a {}", opcode,
                                                  kind == PickleKind::kList ? "list" : kind == PickleKind::kDict ? "dict" : "set"));
    return target;
  }

  void push_string(PickleKind kind, uint64_t length) {
    PickleValue* value = make(kind);
    value->text = std::string(take(length));
    push(value);
  }
  void push_int(int64_t number) {
    PickleValue* value = make(PickleKind::kInt);
    value->integer = number;
    push(value);
  }
  void push_long(uint64_t length) {
    if (length > 8) damaged("an integer is wider than 64 bits");
    const std::string_view raw = take(length);
    uint64_t value = 0;
    for (int i = static_cast<int>(length) - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(raw[i]);
    if (length > 0 && length < 8 && (static_cast<unsigned char>(raw[length - 1]) & 0x80)) {
      value |= ~uint64_t{0} << (8 * length);  // two's complement, sign-extended
    }
    push_int(static_cast<int64_t>(value));
  }
  void push_global(std::string module, std::string name) {
    std::string qualified = module + "." + name;
    if (allowed_.count(qualified) == 0) {
      damaged(fmt::format("it names `{}`, which this kind of file never holds (a forged or foreign file: it is "
                          "refused, never run)", qualified));
    }
    PickleValue* value = make(PickleKind::kGlobal);
    value->text = std::move(qualified);
    push(value);
  }
  void push_tuple(std::vector<PickleValue*> items) {
    PickleValue* tuple = make(PickleKind::kTuple);
    tuple->items.assign(items.begin(), items.end());
    push(tuple);
  }
  void make_object(PickleValue* callable, PickleValue* args, const char* opcode) {
    if (callable->kind != PickleKind::kGlobal) damaged(fmt::format("{} calls something that is not a named class", opcode));
    if (args->kind != PickleKind::kTuple) damaged(fmt::format("{} has arguments that are not a tuple", opcode));
    // OrderedDict() is a dict that later SETITEMS fill, as in every state dict PyTorch pickles.
    PickleValue* made = make(callable->text == "collections.OrderedDict" && args->items.empty() ? PickleKind::kDict
                                                                                                : PickleKind::kObject);
    if (made->kind == PickleKind::kObject) {
      made->text = callable->text;
      count_items(args->items.size());
      made->items = args->items;
    }
    push(made);
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  void memo_get(uint64_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) damaged(fmt::format("it refers to memo entry {}, which was never stored", index));
    push(found->second);
  }

  void step(unsigned char op) {
    switch (op) {
      case 0x80: take(1); break;                                      // PROTO
      case 0x95: take(8); break;                                      // FRAME: a read-ahead hint
      case '(': marks_.push_back(stack_.size()); break;               // MARK
      case '0': pop(); break;                                         // POP
      case '1': pop_mark(); break;                                    // POP_MARK
      case '2': push(top()); break;                                   // DUP
      case 'N': push(make(PickleKind::kNone)); break;
      case 0x88: case 0x89: {                                         // NEWTRUE, NEWFALSE
        PickleValue* value = make(PickleKind::kBool);
        value->boolean = op == 0x88;
        push(value);
        break;
      }
      case 'J': push_int(static_cast<int32_t>(little_endian(4))); break;  // BININT
      case 'K': push_int(static_cast<int64_t>(little_endian(1))); break;  // BININT1
      case 'M': push_int(static_cast<int64_t>(little_endian(2))); break;  // BININT2
      case 0x8a: push_long(little_endian(1)); break;                      // LONG1
      case 0x8b: push_long(little_endian(4)); break;                      // LONG4
      case 'G': {                                                         // BINFLOAT, big-endian
        const std::string_view raw = take(8);
        uint64_t bits = 0;
        for (char c : raw) bits = (bits << 8) | static_cast<unsigned char>(c);
        PickleValue* value = make(PickleKind::kFloat);
        std::memcpy(&value->real, &bits, sizeof bits);
        push(value);
        break;
      }
      case 'X': push_string(PickleKind::kString, little_endian(4)); break;      // BINUNICODE
      case 0x8c: push_string(PickleKind::kString, little_endian(1)); break;     // SHORT_BINUNICODE
      case 0x8d: push_string(PickleKind::kString, little_endian(8)); break;     // BINUNICODE8
      case 'T': push_string(PickleKind::kString, little_endian(4)); break;      // BINSTRING (protocol 1's str)
      case 'U': push_string(PickleKind::kString, little_endian(1)); break;      // SHORT_BINSTRING
      case 'B': push_string(PickleKind::kBytes, little_endian(4)); break;       // BINBYTES
      case 'C': push_string(PickleKind::kBytes, little_endian(1)); break;       // SHORT_BINBYTES
      case 0x8e: push_string(PickleKind::kBytes, little_endian(8)); break;      // BINBYTES8
      case ')': push_tuple({}); break;                                    // EMPTY_TUPLE
      case 't': push_tuple(pop_mark()); break;                            // TUPLE
      case 0x85: case 0x86: case 0x87: {                                  // TUPLE1, TUPLE2, TUPLE3
        std::vector<PickleValue*> items(op - 0x84);
        for (auto item = items.rbegin(); item != items.rend(); ++item) *item = pop();
        push_tuple(std::move(items));
        break;
      }
      case ']': push(make(PickleKind::kList)); break;                           // EMPTY_LIST
      case 'l': {                                                         // LIST
        PickleValue* list = make(PickleKind::kList);
        for (PickleValue* item : pop_mark()) list->items.push_back(item);
        push(list);
        break;
      }
      case 'a': {                                                         // APPEND
        PickleValue* item = pop();
        container(PickleKind::kList, "APPEND")->items.push_back(item);
        break;
      }
      case 'e': {                                                         // APPENDS
        std::vector<PickleValue*> items = pop_mark();
        PickleValue* list = container(PickleKind::kList, "APPENDS");
        list->items.insert(list->items.end(), items.begin(), items.end());
        break;
      }
      case '}': push(make(PickleKind::kDict)); break;                           // EMPTY_DICT
      case 'd': {                                                         // DICT
        std::vector<PickleValue*> items = pop_mark();
        if (items.size() % 2 != 0) damaged("DICT has a key without a value");
        PickleValue* dict = make(PickleKind::kDict);
        dict->items.assign(items.begin(), items.end());
        push(dict);
        break;
      }
      case 's': {                                                         // SETITEM
        PickleValue* value = pop();
        PickleValue* key = pop();
        PickleValue* dict = container(PickleKind::kDict, "SETITEM");
        dict->items.push_back(key);
        dict->items.push_back(value);
        break;
      }
      case 'u': {                                                         // SETITEMS
        std::vector<PickleValue*> items = pop_mark();
        if (items.size() % 2 != 0) damaged("SETITEMS has a key without a value");
        PickleValue* dict = container(PickleKind::kDict, "SETITEMS");
        dict->items.insert(dict->items.end(), items.begin(), items.end());
        break;
      }
      case 0x8f: push(make(PickleKind::kSet)); break;                           // EMPTY_SET
      case 0x90: {                                                        // ADDITEMS
        std::vector<PickleValue*> items = pop_mark();
        PickleValue* set = container(PickleKind::kSet, "ADDITEMS");
        set->items.insert(set->items.end(), items.begin(), items.end());
        break;
      }
      case 0x91: {                                                        // FROZENSET
        PickleValue* set = make(PickleKind::kSet);
        for (PickleValue* item : pop_mark()) set->items.push_back(item);
        push(set);
        break;
      }
      case 'c': {                                                         // GLOBAL
        std::string module = line();
        push_global(std::move(module), line());
        break;
      }
      case 0x93: {                                                        // STACK_GLOBAL
        PickleValue* name = pop();
        PickleValue* module = pop();
        if (module->kind != PickleKind::kString || name->kind != PickleKind::kString) damaged("STACK_GLOBAL's names are not strings");
        push_global(module->text, name->text);
        break;
      }
      case 'R': {                                                         // REDUCE
        PickleValue* args = pop();
        make_object(pop(), args, "REDUCE");
        break;
      }
      case 0x81: {                                                        // NEWOBJ
        PickleValue* args = pop();
        make_object(pop(), args, "NEWOBJ");
        break;
      }
      case 'b': {                                                         // BUILD
        PickleValue* state = pop();
        PickleValue* target = top();
        if (target->kind != PickleKind::kObject || target->state != nullptr) damaged("BUILD applies to no new object");
        target->state = state;
        break;
      }
      case 'Q': {                                                         // BINPERSID
        PickleValue* id = make(PickleKind::kPersistentId);
        id->items.push_back(pop());
        push(id);
        break;
      }
      case 'q': memo_put(little_endian(1)); break;                        // BINPUT
      case 'r': memo_put(little_endian(4)); break;                        // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); break;                           // MEMOIZE
      case 'h': memo_get(little_endian(1)); break;                        // BINGET
      case 'j': memo_get(little_endian(4)); break;                        // LONG_BINGET
      default:
        damaged(fmt::format("it holds opcode 0x{:02x}, which this kind of file never holds", op));
    }
  }

  std::string_view bytes_;
  const std::set<std::string>& allowed_;
  const std::string& source_;
  std::deque<PickleValue>& values_;
  size_t position_ = 0;
  std::vector<PickleValue*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleValue*> memo_;
  size_t items_ = 0;
};

}  // namespace

PickleDocument read_pickle(std::string_view bytes, const std::set<std::string>& allowed_globals,
                           const std::string& source) {
  PickleDocument document;
  document.root_ = PickleStream(bytes, allowed_globals, source, document.values_).run();
  return document;
}

}  // namespace tandem::checkpoint
