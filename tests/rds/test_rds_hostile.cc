// A hostile RDS peer: a program that speaks our connection protocol (rdma_cm private data,
// RDS frames over an RC QP) with lies in it. The victim is a real RDS socket of this process.
// What must hold: nobody connects claiming an address it does not send from, a claimed ack
// of what was never sent or a sequence outside the window drops the connection rather than
// becoming state, an absurd length allocates nothing, and garbage is never delivered.
#include <fcntl.h>
#include <rdma/rdma_cma.h>
#include <sys/random.h>

#include <array>
#include <fstream>
#include <optional>
#include <string>

#include "rds_test_util.h"
#include "wire/rds_hdr.h"

#include "util/proc.h"

using namespace rdstest;
namespace wire = sv::wire;

namespace {

// The victim process' rdma_cm port, from the registry's answer for (127.0.0.1, port).
uint16_t victim_cm_port(uint16_t port) {
  uint16_t cm = 0;
  uint64_t gen = 0;
  return wire::registry_entry_parse(registry_ask(port), cm, gen) ? cm : 0;
}

long rss_kib() {
  return sv::proc_self_kib("status", "VmRSS");
}

class Attacker {
 public:
  static constexpr size_t kBuf = 80 * 1024;  // the victim's congestion map arrives first

  explicit Attacker(uint64_t gen) : gen_(gen) {
    ch_ = rdma_create_event_channel();
    fcntl(ch_->fd, F_SETFL, O_NONBLOCK);
  }
  ~Attacker() {
    if (id_) {
      rdma_disconnect(id_);
      if (id_->qp) rdma_destroy_qp(id_);
      rdma_destroy_id(id_);
    }
    if (mr_) ibv_dereg_mr(mr_);
    if (cq_) ibv_destroy_cq(cq_);
    if (pd_) ibv_dealloc_pd(pd_);
    rdma_destroy_event_channel(ch_);
  }

  // Connects from 127.0.0.1 to the victim, claiming `claimed_ip` and acking `ack_seq`.
  // Returns the event that ends the attempt: ESTABLISHED, REJECTED, ...
  rdma_cm_event_type connect(uint16_t cm_port, const char* claimed_ip, uint64_t ack_seq,
                             uint16_t kind = wire::kRdsChanData) {
    if (rdma_create_id(ch_, &id_, nullptr, RDMA_PS_TCP)) return RDMA_CM_EVENT_ADDR_ERROR;
    sockaddr_in src = addr(0), dst = addr(cm_port);
    if (rdma_resolve_addr(id_, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                          2000) ||
        wait() != RDMA_CM_EVENT_ADDR_RESOLVED || rdma_resolve_route(id_, 2000) ||
        wait() != RDMA_CM_EVENT_ROUTE_RESOLVED)
      return RDMA_CM_EVENT_ADDR_ERROR;
    pd_ = ibv_alloc_pd(id_->verbs);
    cq_ = ibv_create_cq(id_->verbs, 64, nullptr, nullptr, 0);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    if (rdma_create_qp(id_, pd_, &a)) return RDMA_CM_EVENT_ADDR_ERROR;
    for (uint64_t i = 0; i < 4; ++i) post_recv(i);
    wire::RdsConnPriv p;
    p.ip = addr(0, claimed_ip).sin_addr.s_addr;
    p.cm_port = 1;  // nobody listens there: the victim must never need to call us back
    p.kind = kind;
    p.ack_seq = ack_seq;
    p.gen = gen_;
    std::array<std::byte, wire::kRdsConnPrivLen> pd;
    wire::rds_conn_priv_encode(p, pd.data());
    rdma_conn_param cp{};
    cp.private_data = pd.data();
    cp.private_data_len = static_cast<uint8_t>(pd.size());
    cp.responder_resources = cp.initiator_depth = 1;
    cp.retry_count = cp.rnr_retry_count = 7;
    if (rdma_connect(id_, &cp)) return RDMA_CM_EVENT_CONNECT_ERROR;
    return wait();
  }

  // Sends small frames as SENDs, 15 at a time, each burst's last one signaled (a flood at the
  // wire's pace, not one completion wait each); true once every burst completed.
  bool send_burst(const std::vector<std::vector<std::byte>>& frames) {
    constexpr size_t kBurst = 15, kSlot = 128;
    for (size_t at = 0; at < frames.size(); at += kBurst) {
      const size_t n = std::min(kBurst, frames.size() - at);
      ibv_sge s[kBurst];
      ibv_send_wr wr[kBurst]{};
      for (size_t i = 0; i < n; ++i) {
        const auto& f = frames[at + i];
        if (f.size() > kSlot) return false;
        std::memcpy(buf_.data() + i * kSlot, f.data(), f.size());
        s[i] = {reinterpret_cast<uint64_t>(buf_.data() + i * kSlot),
                static_cast<uint32_t>(f.size()), mr_->lkey};
        wr[i].sg_list = &s[i];
        wr[i].num_sge = 1;
        wr[i].opcode = IBV_WR_SEND;
        wr[i].next = i + 1 < n ? &wr[i + 1] : nullptr;
      }
      wr[n - 1].send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad;
      if (ibv_post_send(id_->qp, wr, &bad)) return false;
      bool done = false;
      for (int i = 0; i < 5000 && !done; ++i) {
        ibv_wc wc;
        const int k = ibv_poll_cq(cq_, 1, &wc);
        if (k > 0 && wc.opcode == IBV_WC_SEND) {
          if (wc.status != IBV_WC_SUCCESS) return false;
          done = true;
        } else if (k > 0) {
          took(wc);
        } else {
          usleep(100);
        }
      }
      if (!done) return false;
    }
    return true;
  }

  // Sends `frame` (a header and payload) as one SEND; true once it completed.
  bool send(const std::vector<std::byte>& frame) {
    std::memcpy(buf_.data(), frame.data(), frame.size());
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), static_cast<uint32_t>(frame.size()),
              mr_->lkey};
    ibv_send_wr wr{}, *bad;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(id_->qp, &wr, &bad)) return false;
    for (int i = 0; i < 5000; ++i) {
      ibv_wc wc;
      const int n = ibv_poll_cq(cq_, 1, &wc);
      if (n > 0 && wc.opcode == IBV_WC_SEND) return wc.status == IBV_WC_SUCCESS;
      if (n > 0) {  // one of our receives (the victim's map, its acks): take the next
        took(wc);
        continue;
      }
      usleep(1000);
    }
    return false;
  }

  // Waits up to ms for a header-only message from the victim whose extension answers a base
  // lookup (kRdsExtMrBase); what it answered, or nothing.
  std::optional<wire::RdsMrBase> base_answer(int ms = 2000) {
    for (int i = 0; i < ms && answers_.empty(); ++i) {
      ibv_wc wc;
      if (ibv_poll_cq(cq_, 1, &wc) > 0)
        took(wc);
      else
        usleep(1000);
    }
    if (answers_.empty()) return std::nullopt;
    const wire::RdsMrBase a = answers_.front();
    answers_.erase(answers_.begin());
    return a;
  }

  // The next connection event within ms (or RDMA_CM_EVENT_TIMEWAIT_EXIT as "none").
  rdma_cm_event_type wait(int ms = 5000) {
    for (int i = 0; i < ms; ++i) {
      rdma_cm_event* ev;
      if (rdma_get_cm_event(ch_, &ev) == 0) {
        const rdma_cm_event_type t = ev->event;
        if (t == RDMA_CM_EVENT_ESTABLISHED)
          have_accept_ =
              wire::rds_conn_priv_decode(static_cast<const std::byte*>(ev->param.conn.private_data),
                                         ev->param.conn.private_data_len, accept_);
        rdma_ack_cm_event(ev);
        return t;
      }
      usleep(1000);
    }
    return RDMA_CM_EVENT_TIMEWAIT_EXIT;
  }

  // The victim's accept, if it carried our private data.
  const wire::RdsConnPriv* accepted() const { return have_accept_ ? &accept_ : nullptr; }

 private:
  // A receive completed: note a base lookup's answer in it, and post the buffer again.
  void took(const ibv_wc& wc) {
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) return;
    const std::byte* b = buf_.data() + (wc.wr_id + 1) * kBuf;
    wire::RdsHeader h;
    if (wc.byte_len >= wire::kRdsHeaderLen && wire::rds_decode(b, h) && h.ext_mr_base)
      answers_.push_back(*h.ext_mr_base);
    post_recv(wc.wr_id);
  }

  void post_recv(uint64_t i) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data() + (i + 1) * kBuf), kBuf, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    ibv_post_recv(id_->qp, &wr, &bad);
  }

  std::vector<wire::RdsMrBase> answers_;
  bool have_accept_ = false;
  wire::RdsConnPriv accept_;
  uint64_t gen_;
  rdma_event_channel* ch_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<std::byte> buf_ = std::vector<std::byte>(5 * kBuf);
};

uint64_t random_gen() {
  uint64_t g = 0;
  if (getrandom(&g, sizeof g, 0) != sizeof g) g = 0x12345;
  return g | 1;
}

std::vector<std::byte> frame(uint64_t seq, uint64_t ack, uint32_t len, uint16_t dport,
                             const std::string& payload, bool fenced = false) {
  wire::RdsHeader h;
  h.ext_fenced = fenced;
  h.sequence = seq;
  h.ack = ack;
  h.len = len;
  h.sport = 4242;
  h.dport = dport;
  std::vector<std::byte> f(wire::kRdsHeaderLen + payload.size());
  wire::rds_encode(h, f.data());
  std::memcpy(f.data() + wire::kRdsHeaderLen, payload.data(), payload.size());
  return f;
}

std::vector<std::byte> fence(uint64_t seq, bool ok) {
  std::vector<std::byte> f(wire::kRdsFenceLen);
  wire::rds_fence_encode({seq, ok}, f.data());
  return f;
}

// The messages the victim has, within ms each, until none more comes.
std::vector<std::string> drain(int fd, int ms = 300) {
  std::vector<std::string> got;
  std::vector<char> b(64);
  while (wait_for(fd, POLLIN, ms) > 0) {
    const ssize_t n = recv_one(fd, b);
    if (n < 0) break;
    got.emplace_back(b.data(), static_cast<size_t>(n));
  }
  return got;
}

struct Victim {
  // Counters sum every process of the registry: with one of its own, a test's exact counts
  // (recv_held_too_much + 1) are not a neighbour's under ctest -j2 (both fence tests count
  // it, and one saw the other's: +2).
  PrivateRegistry own;
  uint16_t port = rdstest::port(0);
  int fd = bound_socket(port);
  uint16_t cm_port = victim_cm_port(port);
  ~Victim() { svrds_close(fd); }
  bool got_nothing(int ms = 200) { return wait_for(fd, POLLIN, ms) == 0; }
};

}  // namespace

TEST(RdsHostilePeer, AConnectionFromAnotherAddressThanItClaimsIsRefused) {
  Victim v;
  ASSERT_NE(v.cm_port, 0);
  const uint64_t before = counter(v.fd, "conn_reject_bad_addr");
  Attacker a(random_gen());
  EXPECT_EQ(a.connect(v.cm_port, "127.0.0.9", 0), RDMA_CM_EVENT_REJECTED);
  EXPECT_GT(counter(v.fd, "conn_reject_bad_addr"), before);
}

TEST(RdsHostilePeer, AnAckOfWhatWasNeverSentIsRefusedAtConnect) {
  Victim v;
  const uint64_t before = counter(v.fd, "recv_bad_ack");
  Attacker a(random_gen());
  EXPECT_EQ(a.connect(v.cm_port, "127.0.0.1", ~0ull), RDMA_CM_EVENT_REJECTED);
  EXPECT_GT(counter(v.fd, "recv_bad_ack"), before);
}

TEST(RdsHostilePeer, AGigabyteLengthDropsTheConnectionAndAllocatesNothing) {
  Victim v;
  const uint64_t before = counter(v.fd, "recv_drop_bad_len");
  Attacker a(random_gen());
  ASSERT_EQ(a.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  const long rss = rss_kib();
  ASSERT_TRUE(a.send(frame(1, 0, 1u << 30, v.port, std::string(16, 'x'))));
  EXPECT_EQ(a.wait(), RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_LT(rss_kib() - rss, 64 * 1024) << "KiB allocated for the frame";
  EXPECT_GE(counter(v.fd, "recv_drop_bad_len"), before + 1u);
  EXPECT_TRUE(v.got_nothing());
}

TEST(RdsHostilePeer, ASequenceOutsideTheWindowIsNeverAdopted) {
  Victim v;
  const uint64_t before = counter(v.fd, "recv_drop_bad_seq");
  const uint64_t gen = random_gen();
  {
    Attacker a(gen);
    ASSERT_EQ(a.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
    ASSERT_TRUE(a.send(frame(~0ull - 15, 0, 4, v.port, "evil")));
    EXPECT_EQ(a.wait(), RDMA_CM_EVENT_DISCONNECTED);
  }
  EXPECT_GE(counter(v.fd, "recv_drop_bad_seq"), before + 1u);
  EXPECT_TRUE(v.got_nothing());
  // The same peer again, honest this time: its sequence 1 is delivered, so the lie did not
  // become the receive state (it would have made 1 a duplicate).
  Attacker b(gen);
  ASSERT_EQ(b.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_TRUE(b.send(frame(1, 0, 4, v.port, "good")));
  std::vector<char> got(16);
  sockaddr_in from{};
  ASSERT_EQ(recv_one(v.fd, got, &from), 4);
  EXPECT_EQ(std::string(got.data(), 4), "good");
  EXPECT_EQ(ntohs(from.sin_port), 4242);
}

TEST(RdsHostilePeer, AnAckInAFrameBeyondWhatWasSentDropsTheConnection) {
  Victim v;
  Attacker a(random_gen());
  ASSERT_EQ(a.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  const uint64_t before = counter(v.fd, "recv_bad_ack");
  ASSERT_TRUE(a.send(frame(1, 1000, 4, v.port, "evil")));
  EXPECT_EQ(a.wait(), RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_GT(counter(v.fd, "recv_bad_ack"), before);
  EXPECT_TRUE(v.got_nothing());
}

TEST(RdsHostilePeer, ABadHeaderChecksumDropsTheConnection) {
  Victim v;
  const uint64_t before = counter(v.fd, "recv_drop_bad_csum");
  Attacker a(random_gen());
  ASSERT_EQ(a.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  auto f = frame(1, 0, 4, v.port, "flip");
  f[23] ^= std::byte{1};  // dport changed after the checksum was computed
  ASSERT_TRUE(a.send(f));
  EXPECT_EQ(a.wait(), RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_GE(counter(v.fd, "recv_drop_bad_csum"), before + 1u);
  EXPECT_TRUE(v.got_nothing());
}

TEST(RdsHostilePeer, RandomFramesAreNeverDelivered) {
  Victim v;
  const uint64_t before = counter(v.fd, "recv_protocol_error");
  const uint64_t gen = random_gen();
  int frames = 0;
  uint32_t seed = 1;
  auto rnd = [&] { return seed = seed * 1103515245u + 12345u; };
  while (frames < 300) {
    Attacker a(gen);
    ASSERT_EQ(a.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
    // Random frames until one costs the connection.
    for (;;) {
      std::vector<std::byte> f(48 + rnd() % 200);
      for (auto& b : f) b = std::byte(rnd() >> 16);
      // Aimed at the victim's port so that a frame that got through would be seen.
      wire::store_be16(f.data() + 22, v.port);
      ++frames;
      // A send that fails met a connection the victim already dropped.
      if (!a.send(f) || a.wait(20) == RDMA_CM_EVENT_DISCONNECTED) break;
      if (frames >= 300) break;
    }
  }
  EXPECT_TRUE(v.got_nothing());
  EXPECT_GE(counter(v.fd, "recv_protocol_error"), before + 250u);
}

// Fences (softverbs' own, wire/rds_hdr.h): a message marked fenced reports a Write on the
// sender's RDMA channel, and is delivered only once the fence behind that Write arrives
// there; a failure verdict drops it. Scripted from both of the peer's QPs.
TEST(RdsFence, AFencedMessageWaitsForItsFenceAndAVerdictDropsIt) {
  Victim v;
  const uint64_t before = counter(v.fd, "recv_drop_rdma_failed");
  const uint64_t gen = random_gen();
  Attacker data(gen), chan(gen);
  ASSERT_EQ(data.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_EQ(chan.connect(v.cm_port, "127.0.0.1", 0, wire::kRdsChanRdma), RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(chan.accepted(), nullptr);
  EXPECT_EQ(chan.accepted()->ack_seq, 0u) << "no fence yet";

  ASSERT_TRUE(data.send(frame(1, 0, 3, v.port, "one", true)));
  ASSERT_TRUE(data.send(frame(2, 0, 3, v.port, "two")));
  EXPECT_TRUE(v.got_nothing()) << "held for the fence, and what follows it waits in order";
  ASSERT_TRUE(chan.send(fence(1, true)));
  EXPECT_EQ(drain(v.fd), (std::vector<std::string>{"one", "two"}));

  // A failure verdict drops its message (both or neither), not the ones behind it.
  ASSERT_TRUE(data.send(frame(3, 0, 3, v.port, "bad", true)));
  ASSERT_TRUE(data.send(frame(4, 0, 4, v.port, "four")));
  EXPECT_TRUE(v.got_nothing());
  ASSERT_TRUE(chan.send(fence(3, false)));
  EXPECT_EQ(drain(v.fd), (std::vector<std::string>{"four"}));

  // The verdict may come before its message: it is remembered until the message comes.
  ASSERT_TRUE(chan.send(fence(5, false)));
  ASSERT_TRUE(chan.send(fence(6, true)));
  ASSERT_TRUE(data.send(frame(5, 0, 4, v.port, "bad2", true)));
  ASSERT_TRUE(data.send(frame(6, 0, 4, v.port, "six!", true)));
  EXPECT_EQ(drain(v.fd), (std::vector<std::string>{"six!"}));
  EXPECT_GE(counter(v.fd, "recv_drop_rdma_failed"), before + 2u);

  // A new channel's accept acks the fences the victim has: the peer does not redo them.
  Attacker chan2(gen);
  ASSERT_EQ(chan2.connect(v.cm_port, "127.0.0.1", 0, wire::kRdsChanRdma),
            RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(chan2.accepted(), nullptr);
  EXPECT_EQ(chan2.accepted()->ack_seq, 6u);
}

TEST(RdsFence, AFenceThatLiesCostsThePeerItsChannelNotItsMessages) {
  Victim v;
  const uint64_t gen = random_gen();
  Attacker data(gen);
  ASSERT_EQ(data.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_TRUE(data.send(frame(1, 0, 4, v.port, "held", true)));
  const uint64_t bad = counter(v.fd, "recv_fence_bad");
  {
    // Beyond the receive window: no fence can be that far ahead of the messages.
    Attacker chan(gen);
    ASSERT_EQ(chan.connect(v.cm_port, "127.0.0.1", 0, wire::kRdsChanRdma),
              RDMA_CM_EVENT_ESTABLISHED);
    ASSERT_TRUE(chan.send(fence(1ull << 40, true)));
    EXPECT_EQ(chan.wait(), RDMA_CM_EVENT_DISCONNECTED);
  }
  {
    // Not a fence at all.
    Attacker chan(gen);
    ASSERT_EQ(chan.connect(v.cm_port, "127.0.0.1", 0, wire::kRdsChanRdma),
              RDMA_CM_EVENT_ESTABLISHED);
    std::vector<std::byte> junk(wire::kRdsFenceLen, std::byte{0x5a});
    ASSERT_TRUE(chan.send(junk));
    EXPECT_EQ(chan.wait(), RDMA_CM_EVENT_DISCONNECTED);
  }
  EXPECT_EQ(counter(v.fd, "recv_fence_bad"), bad + 2);
  EXPECT_TRUE(v.got_nothing()) << "a lie releases nothing";
  // An honest fence afterwards still releases the held message.
  Attacker chan(gen);
  ASSERT_EQ(chan.connect(v.cm_port, "127.0.0.1", 0, wire::kRdsChanRdma), RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_EQ(chan.accepted()->ack_seq, 0u) << "the lie did not become the fence state";
  ASSERT_TRUE(chan.send(fence(1, true)));
  EXPECT_EQ(drain(v.fd), (std::vector<std::string>{"held"}));
}

// A peer that never sends its fences (and ignores that held messages are not acked) cannot
// make the victim hold without bound: past kMaxHeldBytes its connection drops, and what it
// made the victim hold is freed (not checked by RSS here: ASan's quarantine keeps freed memory).
TEST(RdsFence, HoldingForFencesIsBounded) {
  Victim v;
  const uint64_t before = counter(v.fd, "recv_held_too_much");
  Attacker data(random_gen());
  ASSERT_EQ(data.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  const std::string chunk(64 * 1024, 'h');
  // 1 MiB messages in 64 KiB fragments, each fenced, no fence ever: the 65th MiB is over.
  bool dropped = false;
  for (uint64_t seq = 1; seq <= 70 && !dropped; ++seq)
    for (int frag = 0; frag < 16 && !dropped; ++frag) {
      const uint32_t len = 16 * static_cast<uint32_t>(chunk.size());
      if (!data.send(frame(seq, 0, len, v.port, chunk, true))) dropped = true;
    }
  // The victim may still be taking in what was sent (slowly, under a sanitizer).
  for (int i = 0; i < 12 && !dropped; ++i) dropped = data.wait() == RDMA_CM_EVENT_DISCONNECTED;
  EXPECT_TRUE(dropped);
  EXPECT_EQ(counter(v.fd, "recv_held_too_much"), before + 1u);
  EXPECT_TRUE(v.got_nothing());
}

// The same with empty messages: one fenced message whose fence never comes, then empty ones
// behind it, each held in order. Counted by their payload alone they cost nothing, and the
// victim held them without bound; each entry now costs kHeldEntryCost, so the connection
// drops after 16 Ki of them.
TEST(RdsFence, HoldingEmptyMessagesForFencesIsBoundedToo) {
  Victim v;
  const uint64_t before = counter(v.fd, "recv_held_too_much");
  Attacker data(random_gen());
  ASSERT_EQ(data.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  bool dropped = !data.send(frame(1, 0, 4, v.port, "held", true));
  std::vector<std::vector<std::byte>> empties;
  for (uint64_t seq = 2; seq <= 20000; ++seq) empties.push_back(frame(seq, 0, 0, v.port, ""));
  if (!dropped && !data.send_burst(empties)) dropped = true;
  for (int i = 0; i < 12 && !dropped; ++i) dropped = data.wait() == RDMA_CM_EVENT_DISCONNECTED;
  EXPECT_TRUE(dropped) << "20,000 empty messages held behind a fence that never came";
  EXPECT_EQ(counter(v.fd, "recv_held_too_much"), before + 1u);
  // Nothing the peer sent after the one it never fenced is delivered, not even what was
  // already on its way when the connection dropped: those are unacked, to come again.
  EXPECT_EQ(drain(v.fd).size(), 0u);
}

// Base lookups (a peer whose regions are by virtual address asks where one starts, rdma.cc):
// a question about a region we do not have is answered "none" (base 0), and one about a real
// region with its address; answers to questions the victim never asked (it has none out: this
// checks only that they are taken as nothing, no crash, no state) do not cost the connection
// either: the peer's next message is delivered.
TEST(RdsHostilePeer, BaseLookupsAboutNothingAndForgedAnswersChangeNothing) {
  PrivateRegistry own;  // the answer count below is this process' alone
  // Regions by VA, so that "none" is a lookup that found nothing (a zero-based stack answers
  // 0 to anything): read when the stack starts, as the victim binds.
  setenv("SOFTVERBS_RDS_MR_VA", "1", 1);
  Victim v;
  const uint64_t answered = counter(v.fd, "rdma_base_answered");
  Attacker a(random_gen());
  ASSERT_EQ(a.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  auto header = [](std::optional<uint32_t> ask, std::optional<wire::RdsMrBase> answer) {
    wire::RdsHeader h;
    h.ext_mr_base_req = ask;
    h.ext_mr_base = answer;
    std::vector<std::byte> f(wire::kRdsHeaderLen);
    wire::rds_encode(h, f.data());
    return f;
  };
  ASSERT_TRUE(a.send(header(0x1234u, std::nullopt)));
  auto none = a.base_answer();
  ASSERT_TRUE(none.has_value()) << "no answer to a base lookup";
  EXPECT_EQ(none->rkey, 0x1234u);
  EXPECT_EQ(none->base, 0u) << "no region has that rkey";
  ASSERT_TRUE(a.send(header(std::nullopt, wire::RdsMrBase{0x1234u, 0x7000'0000'0000ull})));
  ASSERT_TRUE(a.send(header(std::nullopt, wire::RdsMrBase{0, ~0ull})));
  ASSERT_TRUE(a.send(frame(1, 0, 4, v.port, "good")));
  std::vector<char> got(16);
  ASSERT_EQ(recv_one(v.fd, got), 4);
  EXPECT_EQ(std::string(got.data(), 4), "good");
  EXPECT_EQ(counter(v.fd, "rdma_base_answered"), answered + 1);
  EXPECT_NE(a.wait(200), RDMA_CM_EVENT_DISCONNECTED);
  unsetenv("SOFTVERBS_RDS_MR_VA");
}

// A victim whose regions are by virtual address (SOFTVERBS_RDS_MR_VA=1, as on Linux siw)
// answers with the address its region was registered at (the cookie's offset counts from it).
TEST(RdsHostilePeer, ABaseLookupIsAnsweredWithTheRegionsAddress) {
  PrivateRegistry own;
  setenv("SOFTVERBS_RDS_MR_VA", "1", 1);  // read when the stack starts, as the victim binds
  Victim v;
  std::vector<char> region(3 * 4096);
  char* at = region.data() + 10;
  const uint64_t cookie = get_mr(v.fd, at, 4096);
  ASSERT_NE(cookie, 0u);
  Attacker a(random_gen());
  ASSERT_EQ(a.connect(v.cm_port, "127.0.0.1", 0), RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(a.accepted(), nullptr);
  EXPECT_TRUE(a.accepted()->flags & wire::kRdsPrivVaMrs) << "the accept says so";
  wire::RdsHeader h;
  h.ext_mr_base_req = static_cast<uint32_t>(cookie);
  std::vector<std::byte> f(wire::kRdsHeaderLen);
  wire::rds_encode(h, f.data());
  ASSERT_TRUE(a.send(f));
  const auto got = a.base_answer();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->rkey, static_cast<uint32_t>(cookie));
  const uint64_t page = reinterpret_cast<uint64_t>(at) & ~4095ull;
  EXPECT_EQ(got->base, page);
  EXPECT_EQ(got->base + (cookie >> 32), reinterpret_cast<uint64_t>(at)) << "base + offset";
  unsetenv("SOFTVERBS_RDS_MR_VA");
}
