/* wanprobe: the UDP probes with which benchmarks/wan/emulator.py checks an emulated link
 * (round trip time, rate, loss). Each mode prints one JSON line on stdout.
 *
 *   wanprobe echo PORT SECONDS
 *       return every datagram to its sender, for SECONDS.
 *   wanprobe ping ADDR PORT COUNT INTERVAL_US WAIT_MS
 *       COUNT datagrams of 64 bytes (IP), one every INTERVAL_US, to an echo; then waits up to
 *       WAIT_MS for the last replies. Prints each round trip time in microseconds, measured
 *       from just before the send to the kernel's receive timestamp of the reply, less the
 *       time the echo held the datagram (so neither end's scheduling delay counts).
 *   wanprobe send ADDR PORT BITS_PER_S IP_BYTES COUNT
 *       COUNT datagrams of IP_BYTES bytes (IP and UDP headers included), paced at BITS_PER_S
 *       counted in IP bytes, each carrying its sequence number; then end markers that carry
 *       COUNT.
 *   wanprobe recv PORT WAIT_MS
 *       counts the datagrams of one `send` until its first end marker (or WAIT_MS without
 *       one): received, lost (COUNT - received), and the rate at which they arrived, in IP
 *       bits per second between the first and the last arrival (kernel timestamps).
 *       Datagrams dropped because this socket's buffer was full are counted apart.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define kHeaders 28            /* IPv4 + UDP headers, counted in every rate and size */
#define kPingBytes 64
#define kEndMarkers 20         /* a lost marker is replaced by the next one */
#define kEndSeq UINT64_MAX
#define kBuffer (32 << 20)     /* socket buffers: a receiver late by tens of ms loses nothing */

struct datagram {
    uint64_t seq;
    uint64_t value;  /* ping: send time (ns, CLOCK_REALTIME); end marker: datagrams sent */
    uint64_t held;   /* ping reply: ns the echo held it (kernel receive time to its reply) */
};

static void die(const char *what) {
    fprintf(stderr, "wanprobe: %s: %s\n", what, errno ? strerror(errno) : "bad argument");
    exit(2);
}

static int64_t clock_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct sockaddr_in address(const char *ip, int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) die("address");
    return a;
}

/* A UDP socket with large buffers, kernel receive timestamps and drop counts; bound to
 * PORT on every address when port > 0. */
static int udp_socket(int port) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0), on = 1, size = kBuffer;
    if (fd < 0) die("socket");
    /* FORCE variants exceed net.core.*mem_max (the emulator runs as root); else the plain one. */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
    setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, &on, sizeof on);
    if (port > 0) {
        struct sockaddr_in a = address("0.0.0.0", port);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    }
    return fd;
}

/* One datagram, waiting at most wait_ms (-1: forever). Returns its length (-1 on timeout)
 * and fills the kernel's receive time and the socket's running drop count. */
static ssize_t receive(int fd, void *buf, size_t size, int wait_ms, int64_t *when, uint32_t *drops,
                       struct sockaddr_in *from) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, wait_ms) <= 0) return -1;
    char control[256];
    struct iovec iov = {buf, size};
    struct msghdr m = {0};
    m.msg_name = from;
    m.msg_namelen = from ? sizeof *from : 0;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    ssize_t n = recvmsg(fd, &m, 0);
    if (n < 0) return errno == EINTR ? 0 : -1;
    *when = clock_ns(CLOCK_REALTIME);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET) continue;
        if (c->cmsg_type == SO_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof ts);
            *when = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        } else if (c->cmsg_type == SO_RXQ_OVFL && drops) {
            memcpy(drops, CMSG_DATA(c), sizeof *drops);
        }
    }
    return n;
}

static int echo(int port, int seconds) {
    int fd = udp_socket(port);
    char buf[2048];
    int64_t end = clock_ns(CLOCK_MONOTONIC) + (int64_t)seconds * 1000000000;
    uint64_t echoed = 0;
    while (clock_ns(CLOCK_MONOTONIC) < end) {
        struct sockaddr_in from;
        int64_t when;
        ssize_t n = receive(fd, buf, sizeof buf, 200, &when, NULL, &from);
        if (n < (ssize_t)sizeof(struct datagram)) continue;
        struct datagram d;
        memcpy(&d, buf, sizeof d);
        d.held = (uint64_t)(clock_ns(CLOCK_REALTIME) - when);
        memcpy(buf, &d, sizeof d);
        if (sendto(fd, buf, n, 0, (struct sockaddr *)&from, sizeof from) == n) echoed++;
    }
    printf("{\"echoed\": %llu}\n", (unsigned long long)echoed);
    return 0;
}

static int ping(const char *ip, int port, int count, int interval_us, int wait_ms) {
    int fd = udp_socket(0);
    struct sockaddr_in to = address(ip, port);
    int64_t *rtt = calloc(count, sizeof *rtt);
    char buf[kPingBytes - kHeaders];
    memset(buf, 0, sizeof buf);
    int sent = 0, got = 0;
    int64_t start = clock_ns(CLOCK_MONOTONIC), last_send = start;
    while (got < count) {
        int64_t now = clock_ns(CLOCK_MONOTONIC), next = start + (int64_t)sent * interval_us * 1000;
        if (sent < count && now >= next) {
            struct datagram d = {(uint64_t)sent, (uint64_t)clock_ns(CLOCK_REALTIME), 0};
            memcpy(buf, &d, sizeof d);
            if (sendto(fd, buf, sizeof buf, 0, (struct sockaddr *)&to, sizeof to) < 0) die("sendto");
            sent++;
            last_send = now;
            continue;
        }
        if (sent == count && now > last_send + (int64_t)wait_ms * 1000000) break;
        int wait = sent < count ? (int)((next - now + 999999) / 1000000) : wait_ms;
        int64_t when;
        struct datagram d;
        ssize_t n = receive(fd, buf, sizeof buf, wait, &when, NULL, NULL);
        if (n < (ssize_t)sizeof d) continue;
        memcpy(&d, buf, sizeof d);
        if (d.seq < (uint64_t)count && rtt[d.seq] == 0) {
            rtt[d.seq] = when - (int64_t)d.value - (int64_t)d.held;
            got++;
        }
    }
    printf("{\"sent\": %d, \"received\": %d, \"rtt_us\": [", sent, got);
    for (int i = 0, first = 1; i < count; i++) {
        if (!rtt[i]) continue;
        printf("%s%.1f", first ? "" : ", ", rtt[i] / 1e3);
        first = 0;
    }
    printf("]}\n");
    return 0;
}

static int send_paced(const char *ip, int port, double bps, int ip_bytes, long long count) {
    if (ip_bytes < kHeaders + (int)sizeof(struct datagram) || ip_bytes > 1500) die("IP_BYTES");
    int fd = udp_socket(0);
    struct sockaddr_in to = address(ip, port);
    char buf[1500];
    memset(buf, 0, sizeof buf);
    size_t payload = (size_t)(ip_bytes - kHeaders);
    double ns_per_datagram = ip_bytes * 8e9 / bps;
    int64_t start = clock_ns(CLOCK_MONOTONIC);
    for (long long k = 0; k < count; k++) {
        int64_t due = start + (int64_t)(k * ns_per_datagram), now = clock_ns(CLOCK_MONOTONIC);
        if (due - now > 200000) { /* sleep only when well ahead: bursts of a few datagrams */
            struct timespec ts = {due / 1000000000, due % 1000000000};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        }
        struct datagram d = {(uint64_t)k, 0, 0};
        memcpy(buf, &d, sizeof d);
        if (sendto(fd, buf, payload, 0, (struct sockaddr *)&to, sizeof to) < 0) die("sendto");
    }
    double seconds = (clock_ns(CLOCK_MONOTONIC) - start) / 1e9;
    /* Markers follow the data through the same FIFO path, so the first one to arrive comes
     * after every data datagram that was not lost. */
    for (int m = 0; m < kEndMarkers; m++) {
        struct datagram d = {kEndSeq, (uint64_t)count, 0};
        memcpy(buf, &d, sizeof d);
        sendto(fd, buf, sizeof d, 0, (struct sockaddr *)&to, sizeof to);
        usleep(2000);
    }
    printf("{\"sent\": %lld, \"seconds\": %.6f, \"offered_bps\": %.0f}\n", count, seconds,
           seconds > 0 ? count * ip_bytes * 8 / seconds : 0);
    return 0;
}

static int receive_count(int port, int wait_ms) {
    int fd = udp_socket(port);
    char buf[2048];
    long long received = 0, sent = -1;
    uint64_t bytes_after_first = 0;
    int64_t first = 0, last = 0;
    uint32_t drops = 0;
    printf("{\"listening\": true}\n");
    fflush(stdout);
    for (;;) {
        int64_t when;
        struct datagram d;
        ssize_t n = receive(fd, buf, sizeof buf, wait_ms, &when, &drops, NULL);
        if (n < 0) break;
        if (n < (ssize_t)sizeof d) continue;
        memcpy(&d, buf, sizeof d);
        if (d.seq == kEndSeq) {
            sent = (long long)d.value;
            break;
        }
        if (received++ == 0) first = when;
        else bytes_after_first += (uint64_t)n + kHeaders;
        last = when;
    }
    double span = (last - first) / 1e9;
    printf("{\"received\": %lld, \"sent\": %lld, \"lost\": %lld, \"socket_drops\": %u, "
           "\"span_s\": %.6f, \"rate_bps\": %.0f}\n",
           received, sent, sent >= 0 ? sent - received : -1, drops, span,
           span > 0 ? bytes_after_first * 8 / span : 0);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && !strcmp(argv[1], "echo")) return echo(atoi(argv[2]), atoi(argv[3]));
    if (argc == 7 && !strcmp(argv[1], "ping"))
        return ping(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    if (argc == 7 && !strcmp(argv[1], "send"))
        return send_paced(argv[2], atoi(argv[3]), atof(argv[4]), atoi(argv[5]), atoll(argv[6]));
    if (argc == 4 && !strcmp(argv[1], "recv")) return receive_count(atoi(argv[2]), atoi(argv[3]));
    fprintf(stderr, "usage: see the comment at the top of wanprobe.c\n");
    return 2;
}
