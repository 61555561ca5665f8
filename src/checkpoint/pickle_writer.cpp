// The pickle writer (pickle.h): protocol 2's opcodes, little-endian arguments, BINFLOAT big-endian as Python has it.
#include <cstring>

#include "pickle.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

void append_pickle_number(std::string& out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

PickleWriter::PickleWriter() { out_ = "\x80\x02"; }

void PickleWriter::none() { out_.push_back('N'); }

void PickleWriter::boolean(bool value) { out_.push_back(static_cast<char>(value ? 0x88 : 0x89)); }

void PickleWriter::integer(int64_t value) {
  if (value >= 0 && value < 256) {
    out_.push_back('K');
    append_pickle_number(out_, static_cast<uint64_t>(value), 1);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out_.push_back('J');
    append_pickle_number(out_, static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
  } else {
    out_.push_back(static_cast<char>(0x8a));  // LONG1 with 8 bytes of two's complement
    out_.push_back(8);
    append_pickle_number(out_, static_cast<uint64_t>(value), 8);
  }
}

void PickleWriter::real(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  out_.push_back('G');
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void PickleWriter::string(std::string_view value) {
  TANDEM_CHECK(value.size() <= UINT32_MAX, "a pickled string over 4 GiB");
  out_.push_back('X');
  append_pickle_number(out_, value.size(), 4);
  out_.append(value);
}

void PickleWriter::global(std::string_view module, std::string_view name) {
  out_.push_back('c');
  out_.append(module);
  out_.push_back('\n');
  out_.append(name);
  out_.push_back('\n');
}

void PickleWriter::mark() { out_.push_back('('); }
void PickleWriter::tuple_from_mark() { out_.push_back('t'); }

void PickleWriter::tuple(int count) {
  TANDEM_CHECK(count >= 0 && count <= 3, "tuple() takes 0 to 3 values; use mark() and tuple_from_mark()");
  static constexpr char kOpcodes[] = {')', '\x85', '\x86', '\x87'};
  out_.push_back(kOpcodes[count]);
}

void PickleWriter::empty_list() { out_.push_back(']'); }
void PickleWriter::empty_dict() { out_.push_back('}'); }
void PickleWriter::appends_from_mark() { out_.push_back('e'); }
void PickleWriter::setitems_from_mark() { out_.push_back('u'); }
void PickleWriter::reduce() { out_.push_back('R'); }
void PickleWriter::newobj() { out_.push_back('\x81'); }
void PickleWriter::build() { out_.push_back('b'); }
void PickleWriter::persistent_id() { out_.push_back('Q'); }

std::string PickleWriter::finish() {
  out_.push_back('.');
  return std::move(out_);
}

}  // namespace tandem::checkpoint
