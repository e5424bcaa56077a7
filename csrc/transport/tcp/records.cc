#include "csrc/transport/tcp/records.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "csrc/common/error.h"

namespace ringdist {
namespace tcp {

namespace {

// The record's number, little-endian, in the last 8 of the nonce's 12 bytes.
std::array<uint8_t, Aead::kNonceBytes> nonceOf(uint64_t number) {
  std::array<uint8_t, Aead::kNonceBytes> nonce{};
  for (int i = 0; i < 8; ++i) {
    nonce[4 + static_cast<size_t>(i)] = static_cast<uint8_t>(number >> (8 * i));
  }
  return nonce;
}

size_t totalBytes(const iovec* iov, int count) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  return total;
}

bool wouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

}  // namespace

// ---------------------------------------------------------------- writer

ssize_t RecordWriter::writev(int fd, const iovec* iov, int count) {
  size_t written = 0;  // bytes of iov whose records are all on the socket
  for (;;) {
    if (sent_ < outEnd_) {
      ssize_t n = ::send(fd, out_.get() + sent_, outEnd_ - sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (wouldBlock(errno) && written > 0) break;
        return -1;
      }
      sent_ += static_cast<size_t>(n);
      while (!records_.empty() && records_.front().first <= sent_) {
        written += records_.front().second;
        records_.pop_front();
      }
      if (sent_ < outEnd_) break;  // the socket is full
    }
    outEnd_ = 0;
    sent_ = 0;
    const size_t left = totalBytes(iov, count) - written;
    if (left == 0) break;
    seal(iov, count, written, std::min(left, kSealAheadBytes));
  }
  if (written == 0) {
    errno = EAGAIN;
    return -1;
  }
  return static_cast<ssize_t>(written);
}

void RecordWriter::seal(const iovec* iov, int count, size_t offset, size_t bytes) {
  int i = 0;
  while (offset >= iov[i].iov_len) {  // the iovec where `offset` falls
    offset -= iov[i].iov_len;
    ++i;
  }
  while (bytes > 0) {
    const size_t length = std::min(bytes, kMaxRecordBytes);
    uint8_t* out = beginRecord(static_cast<uint32_t>(length));
    for (size_t left = length; left > 0;) {
      const size_t piece = std::min(left, iov[i].iov_len - offset);
      aead_.update(static_cast<const char*>(iov[i].iov_base) + offset, out, piece);
      out += piece;
      left -= piece;
      offset += piece;
      if (offset == iov[i].iov_len && i + 1 < count) {
        offset = 0;
        ++i;
      }
    }
    aead_.seal(out);
    records_.emplace_back(outEnd_, length);
    bytes -= length;
  }
}

uint8_t* RecordWriter::beginRecord(uint32_t field) {
  uint8_t* record = out_.get() + outEnd_;
  outEnd_ += kRecordOverhead + (field & ~kFenceBit);
  for (size_t b = 0; b < kRecordHeaderBytes; ++b) {
    record[b] = static_cast<uint8_t>(field >> (8 * b));
  }
  aead_.begin(nonceOf(number_++).data(), record, kRecordHeaderBytes);
  return record + kRecordHeaderBytes;
}

int RecordWriter::flush(int fd) {
  while (sent_ < outEnd_) {
    ssize_t n = ::send(fd, out_.get() + sent_, outEnd_ - sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) return wouldBlock(errno) ? 0 : -1;
    sent_ += static_cast<size_t>(n);
  }
  outEnd_ = sent_ = 0;
  records_.clear();
  return 1;
}

void RecordWriter::sealFence(const uint8_t* digest) {
  RINGDIST_CHECK(outEnd_ == 0, "a fence sealed behind unwritten records");
  uint8_t* out = beginRecord(static_cast<uint32_t>(kFenceBytes) | kFenceBit);
  aead_.update(digest, out, kFenceBytes);
  aead_.seal(out + kFenceBytes);
}

// ---------------------------------------------------------------- reader

uint32_t RecordReader::nextField() const {
  uint32_t field = 0;
  for (size_t b = 0; b < kRecordHeaderBytes; ++b) {
    field |= static_cast<uint32_t>(in_[inStart_ + b]) << (8 * b);
  }
  return field;
}

bool RecordReader::recordArrived() const {
  const size_t have = inEnd_ - inStart_;
  if (have < kRecordHeaderBytes) return false;
  const size_t length = nextField() & ~kFenceBit;
  // An impossible length counts as arrived: opening it fails authentication.
  return length == 0 || length > kMaxRecordBytes || have >= length + kRecordOverhead;
}

size_t RecordReader::nextLength() {
  const size_t length = nextField();  // a fence's bit makes it too long: not data
  if (length == 0 || length > kMaxRecordBytes) failAuthentication();
  return length;
}

void RecordReader::open(uint8_t* out) { openRecord(out, nextLength()); }

void RecordReader::openRecord(uint8_t* out, size_t length) {
  const uint8_t* record = in_.get() + inStart_;
  aead_.begin(nonceOf(number_++).data(), record, kRecordHeaderBytes);
  aead_.update(record + kRecordHeaderBytes, out, length);
  if (!aead_.open(record + kRecordHeaderBytes + length)) failAuthentication();
  inStart_ += length + kRecordOverhead;
  if (inStart_ == inEnd_) inStart_ = inEnd_ = 0;
}

bool RecordReader::skipToFence(int fd, const uint8_t* digest) {
  if (failed_) failAuthentication();
  plainStart_ = plainEnd_ = 0;  // opened for the aborted group's receives
  for (;;) {
    if (recordArrived()) {
      const uint32_t field = nextField();
      if (field != (kFenceBytes | kFenceBit)) {
        open(plain_.get());  // the aborted group's bytes: authenticated, then dropped
        continue;
      }
      uint8_t theirs[kFenceBytes];
      openRecord(theirs, kFenceBytes);
      RINGDIST_CHECK(std::memcmp(theirs, digest, kFenceBytes) == 0, peer_,
                     " fenced the link for another group: the survivors were given different "
                     "ranks to exclude");
      return true;
    }
    const ssize_t n = fill(fd);
    if (n == 0) RINGDIST_FAIL("connection to ", peer_, " closed by the peer (fence)");
    if (n < 0 && wouldBlock(errno)) return false;
    if (n < 0) RINGDIST_FAIL("connection to ", peer_, " failed (fence): ", std::strerror(errno));
  }
}

ssize_t RecordReader::fill(int fd) {
  if (kReadAheadBytes - inEnd_ < kMaxRecordBytes + kRecordOverhead) {  // room for a whole record
    std::memmove(in_.get(), in_.get() + inStart_, inEnd_ - inStart_);
    inEnd_ -= inStart_;
    inStart_ = 0;
  }
  ssize_t n = ::recv(fd, in_.get() + inEnd_, kReadAheadBytes - inEnd_, MSG_DONTWAIT);
  if (n > 0) inEnd_ += static_cast<size_t>(n);
  return n;
}

void RecordReader::failAuthentication() {
  failed_ = true;
  RINGDIST_FAIL("record from ", peer_,
                " failed authentication: the link is corrupted or tampered with");
}

ssize_t RecordReader::readv(int fd, const iovec* iov, int count) {
  if (failed_) failAuthentication();
  const size_t total = totalBytes(iov, count);
  size_t got = 0;
  int i = 0;
  size_t at = 0;  // within iov[i]
  auto advance = [&](size_t n) {
    got += n;
    at += n;
    while (i < count && at == iov[i].iov_len) {
      at = 0;
      ++i;
    }
  };
  bool readSocket = false;
  while (got < total) {
    if (plainStart_ < plainEnd_) {
      const size_t n = std::min(plainEnd_ - plainStart_, iov[i].iov_len - at);
      std::memcpy(static_cast<char*>(iov[i].iov_base) + at, plain_.get() + plainStart_, n);
      plainStart_ += n;
      if (plainStart_ == plainEnd_) plainStart_ = plainEnd_ = 0;
      advance(n);
    } else if (fenceAhead()) {
      break;  // the peer's last bytes of this group (records.h)
    } else if (recordArrived()) {
      const size_t length = nextLength();
      if (iov[i].iov_len - at >= length) {  // straight into the receive
        open(static_cast<uint8_t*>(iov[i].iov_base) + at);
        advance(length);
      } else {
        open(plain_.get());
        plainStart_ = 0;
        plainEnd_ = length;
      }
    } else if (!readSocket) {
      readSocket = true;
      const ssize_t n = fill(fd);
      if (n <= 0 && got == 0) return n;  // closed, or errno says why
      if (n <= 0) break;
    } else {
      break;
    }
  }
  if (got == 0) {
    errno = EAGAIN;
    return -1;
  }
  return static_cast<ssize_t>(got);
}

bool RecordReader::peek(int fd, void* dst, size_t bytes) {
  if (failed_) failAuthentication();
  bool readSocket = false;
  RINGDIST_CHECK(bytes <= kMaxRecordBytes, "peek of ", bytes, " bytes");
  while (plainEnd_ - plainStart_ < bytes) {
    if (fenceAhead()) {
      return false;
    } else if (recordArrived()) {
      // What is left (less than `bytes`) moves to the front, the next record after it.
      std::memmove(plain_.get(), plain_.get() + plainStart_, plainEnd_ - plainStart_);
      plainEnd_ -= plainStart_;
      plainStart_ = 0;
      const size_t length = nextLength();
      open(plain_.get() + plainEnd_);
      plainEnd_ += length;
    } else if (readSocket || fill(fd) <= 0) {
      return false;  // a close or an error surfaces in the next receive
    } else {
      readSocket = true;
    }
  }
  std::memcpy(dst, plain_.get() + plainStart_, bytes);
  return true;
}

}  // namespace tcp
}  // namespace ringdist
