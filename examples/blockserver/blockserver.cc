// A zero-copy disk block server over RDS, built on RDMA with "immediate data".
//
//   blockserver serve  --addr A --port P --file F [--blocks N] [--block-size B]
//   blockserver client --server A --port P --addr C [--ops K] [--blocks N] [--block-size B]
//
// A client asks the server to READ a block: the server reads the disk, RDMA WRITEs the
// block into the client's buffer and sends its reply with that RDMA, so the reply (the
// "immediate data") reaches the client only after the data is in its memory. A client
// asks to WRITE a block: the server RDMA READs it from the client's buffer, replying
// PULLED with that RDMA (the client may reuse its buffer), then writes the disk, syncs,
// and sends a separate DURABLE message. The client keeps what each block must contain and
// checks every read, then reads the whole device back. Written against <linux/rds.h> and
// the socket API only; linked with the softverbs shim.
#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/rds.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

enum : uint8_t { OP_READ = 1, OP_WRITE = 2, REPLY_DONE = 3, REPLY_PULLED = 4, REPLY_DURABLE = 5 };

struct Msg {
  uint32_t magic;
  uint8_t op;
  uint8_t status;  // 0 ok, else errno-like
  uint16_t pad;
  uint64_t block;
  uint64_t tag;
} __attribute__((packed));
constexpr uint32_t kMagic = 0x424c4b53;  // "BLKS"

struct Opts {
  std::string addr = "127.0.0.1", server = "127.0.0.1", file = "blocks.img";
  int port = 18700, ops = 200;
  uint64_t blocks = 256;
  uint32_t block_size = 65536;
};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "blockserver: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

sockaddr_in make_addr(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) die("address");
  return a;
}

int rds_socket(const sockaddr_in& a) {
  int fd = socket(AF_RDS, SOCK_SEQPACKET, 0);
  if (fd < 0) die("socket(AF_RDS)");
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) < 0) die("bind");
  int buf = 16 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  return fd;
}

// sendmsg with an optional SOL_RDS cmsg, retrying while the socket is busy.
void send_with(int fd, const sockaddr_in& to, const Msg& m, int cmsg_type, const void* arg,
               size_t arg_len) {
  std::vector<char> ctl(arg ? CMSG_SPACE(arg_len) : 0);
  iovec v{const_cast<Msg*>(&m), sizeof m};
  msghdr h{};
  h.msg_name = const_cast<sockaddr_in*>(&to);
  h.msg_namelen = sizeof to;
  h.msg_iov = &v;
  h.msg_iovlen = 1;
  if (arg) {
    h.msg_control = ctl.data();
    h.msg_controllen = ctl.size();
    cmsghdr* cm = CMSG_FIRSTHDR(&h);
    cm->cmsg_level = SOL_RDS;
    cm->cmsg_type = cmsg_type;
    cm->cmsg_len = CMSG_LEN(arg_len);
    std::memcpy(CMSG_DATA(cm), arg, arg_len);
  }
  while (sendmsg(fd, &h, 0) < 0) {
    if (errno != EAGAIN && errno != ENOBUFS) die("sendmsg");
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, 100);
  }
}

// ---- server ---------------------------------------------------------------------------

int serve(const Opts& o) {
  int disk = open(o.file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (disk < 0) die("open block file");
  if (ftruncate(disk, static_cast<off_t>(o.blocks * o.block_size)) < 0) die("ftruncate");
  int fd = rds_socket(make_addr(o.addr, o.port));
  std::printf("blockserver: serving %llu blocks of %u bytes from %s on %s:%d\n",
              static_cast<unsigned long long>(o.blocks), o.block_size, o.file.c_str(),
              o.addr.c_str(), o.port);
  std::fflush(stdout);
  struct Pending {  // a WRITE whose RDMA READ is in flight
    std::vector<char> buf;
    sockaddr_in client;
    Msg req;
  };
  std::map<uint64_t, Pending> pulls;
  std::map<uint64_t, std::vector<char>> sends;  // READ data buffers until their RDMA is done
  uint64_t token = 1, served = 0;
  std::vector<char> in(4096);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, -1) <= 0) continue;
    char ctl[512];
    sockaddr_in from{};
    iovec v{in.data(), in.size()};
    msghdr h{};
    h.msg_name = &from;
    h.msg_namelen = sizeof from;
    h.msg_iov = &v;
    h.msg_iovlen = 1;
    h.msg_control = ctl;
    h.msg_controllen = sizeof ctl;
    ssize_t n = recvmsg(fd, &h, 0);
    if (n < 0) continue;
    uint64_t cookie = 0;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&h); cm; cm = CMSG_NXTHDR(&h, cm)) {
      if (cm->cmsg_level != SOL_RDS) continue;
      if (cm->cmsg_type == RDS_CMSG_RDMA_DEST) std::memcpy(&cookie, CMSG_DATA(cm), 8);
      if (cm->cmsg_type == RDS_CMSG_RDMA_STATUS) {
        rds_rdma_notify note;
        std::memcpy(&note, CMSG_DATA(cm), sizeof note);
        sends.erase(note.user_token);
        auto it = pulls.find(note.user_token);
        if (it == pulls.end()) continue;
        Pending& pw = it->second;
        Msg r{kMagic, REPLY_DURABLE, 0, 0, pw.req.block, pw.req.tag};
        if (note.status != RDS_RDMA_SUCCESS) {
          r.status = EIO;
        } else if (pwrite(disk, pw.buf.data(), o.block_size,
                          static_cast<off_t>(pw.req.block * o.block_size)) !=
                       static_cast<ssize_t>(o.block_size) ||
                   fdatasync(disk) < 0) {
          r.status = EIO;
        }
        // DURABLE is a message of its own, not the RDMA's immediate data: PULLED went with
        // the RDMA READ, before the disk was written and synced.
        send_with(fd, pw.client, r, 0, nullptr, 0);
        pulls.erase(it);
      }
    }
    if (n < static_cast<ssize_t>(sizeof(Msg))) continue;
    Msg req;
    std::memcpy(&req, in.data(), sizeof req);
    if (req.magic != kMagic) continue;
    if (req.block >= o.blocks || !cookie) {
      Msg r{kMagic, req.op == OP_READ ? REPLY_DONE : REPLY_DURABLE, EINVAL, 0, req.block, req.tag};
      send_with(fd, from, r, 0, nullptr, 0);
      continue;
    }
    const uint64_t t = token++;
    rds_rdma_args ra{};
    ra.cookie = cookie;
    ra.remote_vec = {0, o.block_size};
    ra.nr_local = 1;
    ra.user_token = t;
    rds_iovec local{};
    if (req.op == OP_READ) {
      std::vector<char>& data = sends[t];
      data.resize(o.block_size);
      if (pread(disk, data.data(), o.block_size, static_cast<off_t>(req.block * o.block_size)) !=
          static_cast<ssize_t>(o.block_size))
        die("pread");
      local = {reinterpret_cast<uint64_t>(data.data()), o.block_size};
      ra.flags = RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME;
      Msg r{kMagic, REPLY_DONE, 0, 0, req.block, req.tag};
      ra.local_vec_addr = reinterpret_cast<uint64_t>(&local);
      send_with(fd, from, r, RDS_CMSG_RDMA_ARGS, &ra, sizeof ra);
    } else {
      Pending& pw = pulls[t];
      pw.buf.resize(o.block_size);
      pw.client = from;
      pw.req = req;
      local = {reinterpret_cast<uint64_t>(pw.buf.data()), o.block_size};
      ra.flags = RDS_RDMA_NOTIFY_ME | RDS_RDMA_FENCE;
      ra.local_vec_addr = reinterpret_cast<uint64_t>(&local);
      Msg r{kMagic, REPLY_PULLED, 0, 0, req.block, req.tag};
      send_with(fd, from, r, RDS_CMSG_RDMA_ARGS, &ra, sizeof ra);
    }
    ++served;
  }
}

// ---- client ---------------------------------------------------------------------------

uint8_t content(uint64_t block, uint32_t version, size_t i) {
  return static_cast<uint8_t>(block * 31 + version * 7 + i * 13);
}

int client(const Opts& o) {
  int fd = rds_socket(make_addr(o.addr, 0));
  const sockaddr_in srv = make_addr(o.server, o.port);
  std::vector<uint32_t> version(o.blocks, 0);  // 0: never written (zeros)
  std::vector<char> buf(o.block_size);
  std::mt19937_64 rng(42);
  uint64_t tag = 1, reads = 0, writes = 0, bytes = 0;
  auto wait_reply = [&](uint8_t want, uint64_t t) {
    std::vector<char> in(256);
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 10000) <= 0) {
        std::fprintf(stderr, "blockserver client: no reply from the server\n");
        std::exit(1);
      }
      char ctl[256];
      iovec v{in.data(), in.size()};
      msghdr h{};
      h.msg_iov = &v;
      h.msg_iovlen = 1;
      h.msg_control = ctl;
      h.msg_controllen = sizeof ctl;
      ssize_t n = recvmsg(fd, &h, 0);
      if (n < static_cast<ssize_t>(sizeof(Msg))) continue;
      Msg r;
      std::memcpy(&r, in.data(), sizeof r);
      if (r.tag != t || r.op != want) continue;
      if (r.status) {
        std::fprintf(stderr, "blockserver client: server error %d on block %llu\n", r.status,
                     static_cast<unsigned long long>(r.block));
        std::exit(1);
      }
      return;
    }
  };
  auto do_read = [&](uint64_t block) {
    std::memset(buf.data(), 0xEE, buf.size());
    rds_get_mr_args map{{reinterpret_cast<uint64_t>(buf.data()), o.block_size}, 0, 0};
    uint64_t cookie = 0;
    map.cookie_addr = reinterpret_cast<uint64_t>(&cookie);
    map.flags = RDS_RDMA_USE_ONCE;
    Msg m{kMagic, OP_READ, 0, 0, block, tag};
    send_with(fd, srv, m, RDS_CMSG_RDMA_MAP, &map, sizeof map);
    wait_reply(REPLY_DONE, tag++);
    // The reply is the immediate data: the block is already in our buffer.
    for (size_t i = 0; i < o.block_size; ++i) {
      const uint8_t want = version[block] ? content(block, version[block], i) : 0;
      if (static_cast<uint8_t>(buf[i]) != want) {
        std::fprintf(stderr, "blockserver client: block %llu byte %zu is %u, expected %u\n",
                     static_cast<unsigned long long>(block), i, static_cast<uint8_t>(buf[i]), want);
        std::exit(1);
      }
    }
    ++reads;
    bytes += o.block_size;
  };
  auto do_write = [&](uint64_t block) {
    const uint32_t v = version[block] + 1;
    for (size_t i = 0; i < o.block_size; ++i) buf[i] = static_cast<char>(content(block, v, i));
    uint64_t cookie = 0;
    rds_get_mr_args map{{reinterpret_cast<uint64_t>(buf.data()), o.block_size},
                        reinterpret_cast<uint64_t>(&cookie),
                        RDS_RDMA_USE_ONCE};
    Msg m{kMagic, OP_WRITE, 0, 0, block, tag};
    send_with(fd, srv, m, RDS_CMSG_RDMA_MAP, &map, sizeof map);
    wait_reply(REPLY_PULLED, tag);   // the server has our data: the buffer is ours again
    wait_reply(REPLY_DURABLE, tag);  // and it is on disk
    ++tag;
    version[block] = v;
    ++writes;
    bytes += o.block_size;
  };
  for (int i = 0; i < o.ops; ++i) {
    const uint64_t block = rng() % o.blocks;
    if (rng() % 2)
      do_write(block);
    else
      do_read(block);
  }
  for (uint64_t b = 0; b < o.blocks; ++b) do_read(b);  // the whole device, end to end
  std::printf(
      "blockserver client: %llu reads, %llu writes, %llu bytes moved by RDMA, "
      "all blocks verified\n",
      static_cast<unsigned long long>(reads), static_cast<unsigned long long>(writes),
      static_cast<unsigned long long>(bytes));
  close(fd);
  return 0;
}

}  // namespace

constexpr const char kUsage[] =
    "usage: blockserver serve [--addr A] [--port P] [--file F] [--blocks N] [--block-size B]\n"
    "       blockserver client [--server A] [--addr A] [--port P] [--blocks N] [--block-size B]\n"
    "                          [--ops N]\n"
    "       blockserver -h|--help\n";

int main(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  Opts o;
  const std::string mode = argv[1];
  static option opts[] = {
      {"addr", 1, nullptr, 'a'}, {"server", 1, nullptr, 's'}, {"port", 1, nullptr, 'p'},
      {"file", 1, nullptr, 'f'}, {"blocks", 1, nullptr, 'n'}, {"block-size", 1, nullptr, 'b'},
      {"ops", 1, nullptr, 'o'},  {"help", 0, nullptr, 'h'},   {nullptr, 0, nullptr, 0}};
  optind = 2;
  for (int c; (c = getopt_long(argc, argv, "", opts, nullptr)) != -1;) {
    switch (c) {
      case 'a':
        o.addr = optarg;
        break;
      case 's':
        o.server = optarg;
        break;
      case 'p':
        o.port = std::atoi(optarg);
        break;
      case 'f':
        o.file = optarg;
        break;
      case 'n':
        o.blocks = std::strtoull(optarg, nullptr, 0);
        break;
      case 'b':
        o.block_size = static_cast<uint32_t>(std::strtoul(optarg, nullptr, 0));
        break;
      case 'o':
        o.ops = std::atoi(optarg);
        break;
      case 'h':
        std::fputs(kUsage, stdout);
        return 0;
      default:
        std::fputs(kUsage, stderr);
        return 2;
    }
  }
  if (o.block_size == 0 || o.block_size > (1u << 20) || o.blocks == 0) {
    std::fprintf(stderr, "blockserver: block size must be 1..1048576 bytes\n");
    return 2;
  }
  if (mode == "serve") return serve(o);
  if (mode == "client") return client(o);
  std::fputs(kUsage, stderr);
  return 2;
}
