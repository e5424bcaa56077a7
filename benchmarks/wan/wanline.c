/* wanline: a userspace WAN delay line between emulated hosts (benchmarks/wan/emulator.py
 * starts it; see benchmarks/README.md, "Emulated WAN").
 *
 * Terms. A host is one network namespace; it reaches the others through one TUN device that
 * this process owns. Each host has two links: its uplink carries what it sends, its downlink
 * what it receives. A packet read from host i's TUN and addressed to host j crosses uplink i,
 * then downlink j, then is written to host j's TUN. On each link, in order:
 *   loss   the packet is dropped at random with the link's probability;
 *   queue  drop-tail: dropped when the bytes still waiting to be serialised plus its own
 *          exceed the link's queue size;
 *   rate   serialised at the link's rate behind the packets queued before it;
 *   delay  then it takes the link's one-way delay to reach the end of the link.
 * Times are virtual: a packet's serialisation starts when it reaches the link (read time on
 * an uplink, its due time off the uplink on a downlink), not when this process gets to it,
 * so the line's own scheduling delays do not add to the emulated ones. Packets are written
 * when their due time passes; how late that was is recorded (lateness) and reported. While
 * packets flow, the line wakes at most once every T ns (--tick-ns, default 0) and then takes
 * every packet waiting: fewer wake-ups, each packet read and written up to T late.
 *
 * Usage:
 *   wanline --subnet A.B.C --seed S --stats FILE \
 *           --host NAME,UP_BPS,UP_QUEUE,UP_DELAY_NS,UP_LOSS,DOWN_BPS,DOWN_QUEUE,DOWN_DELAY_NS,DOWN_LOSS
 *           [--host ...] [--tick-ns T]        (one per host; host i has address A.B.C.(i+1))
 *           [--control CHANGES]
 * Creates one TUN per host named NAME in the current network namespace, prints "ready", then
 * forwards until SIGTERM, SIGINT or its parent's death. SIGUSR1 and exit write FILE (JSON).
 * SIGUSR2 reads CHANGES, lines "INDEX,UP_BPS,...,DOWN_LOSS" (a --host spec with the host's
 * index for its name), and gives those hosts' links the new settings from then on: packets
 * already on a link keep their times. FILE counts the changes applied ("link_changes").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define kMaxHosts 64
#define kMaxPacket 65536
/* Packets read from one TUN before the timers are served again: bounds how late a due
 * packet can be behind a burst of reads. */
#define kReadBatch 32
/* Lateness histogram bucket upper bounds, in ns (the last bucket is everything above). */
static const int64_t kLateBounds[] = {10000, 100000, 1000000, 10000000};
#define kLateBuckets 5

struct packet {
    struct packet *next;
    int64_t due;  /* when it leaves the link it is on (ns, CLOCK_MONOTONIC) */
    int dst;
    int len;
    unsigned char data[];
};

struct link {
    double ns_per_byte;  /* 0: unlimited rate */
    int64_t queue_bytes;
    int64_t delay_ns;
    uint64_t loss_below; /* a packet is lost when a 64-bit random number falls below this */
    int64_t free_at;     /* when the serialiser finishes the last packet accepted */
    struct packet *head, *tail;
    uint64_t packets, bytes, lost, queue_drops;
};

struct host {
    char name[IFNAMSIZ];
    int fd;
    struct link up, down;
    uint64_t late[kLateBuckets];
    int64_t late_max;
    uint64_t written;
};

static struct host hosts[kMaxHosts];
static int nhosts;
static unsigned char subnet[3];
static uint64_t rng_state;
static uint64_t bad_packets; /* not IPv4, or not addressed to another host */
static const char *stats_path;
static int64_t tick_ns; /* least time between two wake-ups while packets flow */
static const char *control_path;
static uint64_t link_changes;
static volatile sig_atomic_t stop, dump, change;

static void die(const char *what) {
    fprintf(stderr, "wanline: %s: %s\n", what, errno ? strerror(errno) : "bad argument");
    exit(2);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* splitmix64: small, fast, and good enough for Bernoulli losses. */
static uint64_t next_random(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void parse_link(struct link *l, char **fields) {
    double bps = atof(fields[0]), loss = atof(fields[3]);
    if (bps < 0 || loss < 0 || loss > 1) die("link rate or loss out of range");
    l->ns_per_byte = bps > 0 ? 8e9 / bps : 0;
    l->queue_bytes = atoll(fields[1]);
    l->delay_ns = atoll(fields[2]);
    l->loss_below = loss >= 1 ? UINT64_MAX : (uint64_t)(loss * 18446744073709551616.0);
}

static void parse_host(char *spec) {
    char *fields[9];
    int n = 0;
    for (char *tok = strtok(spec, ","); tok && n < 9; tok = strtok(NULL, ",")) fields[n++] = tok;
    if (n != 9 || nhosts == kMaxHosts || strlen(fields[0]) >= IFNAMSIZ) die("--host");
    struct host *h = &hosts[nhosts++];
    strcpy(h->name, fields[0]);
    parse_link(&h->up, fields + 1);
    parse_link(&h->down, fields + 5);
}

/* Applies every line of the control file (SIGUSR2). */
static void apply_changes(void) {
    FILE *f = control_path ? fopen(control_path, "r") : NULL;
    if (!f) die("--control");
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *fields[9];
        int n = 0;
        for (char *tok = strtok(line, ",\n"); tok && n < 9; tok = strtok(NULL, ",\n")) fields[n++] = tok;
        int i = n == 9 ? atoi(fields[0]) : -1;
        if (i < 0 || i >= nhosts) die("control line");
        parse_link(&hosts[i].up, fields + 1);
        parse_link(&hosts[i].down, fields + 5);
    }
    fclose(f);
    link_changes++;
}

static int open_tun(const char *name) {
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) die("open /dev/net/tun");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    memcpy(ifr.ifr_name, name, strlen(name)); /* parse_host checked it fits */
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) die(name);
    return fd;
}

/* The packet arrives at link l at time t: lost, dropped at the queue (both freed), or queued
 * with the time it leaves the link. */
static void enter_link(struct link *l, struct packet *p, int64_t t) {
    if (l->loss_below && next_random() < l->loss_below) {
        l->lost++;
        free(p);
        return;
    }
    int64_t start = l->free_at > t ? l->free_at : t;
    if (l->ns_per_byte > 0) {
        double waiting = (double)(start - t) / l->ns_per_byte;
        if (waiting + p->len > (double)l->queue_bytes) {
            l->queue_drops++;
            free(p);
            return;
        }
        l->free_at = start + (int64_t)(p->len * l->ns_per_byte);
    } else {
        l->free_at = start;
    }
    p->due = l->free_at + l->delay_ns;
    p->next = NULL;
    if (l->tail) l->tail->next = p; else l->head = p;
    l->tail = p;
    l->packets++;
    l->bytes += p->len;
}

static struct packet *pop(struct link *l) {
    struct packet *p = l->head;
    l->head = p->next;
    if (!l->head) l->tail = NULL;
    return p;
}

/* Index of the host a packet is addressed to, or -1. */
static int destination(const unsigned char *d, int len, int from) {
    if (len < 20 || (d[0] >> 4) != 4 || memcmp(d + 16, subnet, 3) != 0) return -1;
    int j = d[19] - 1;
    return j >= 0 && j < nhosts && j != from ? j : -1;
}

static void read_host(int i) {
    static unsigned char buf[kMaxPacket];
    for (int k = 0; k < kReadBatch; k++) {
        ssize_t n = read(hosts[i].fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            if (errno == EBADFD) { /* its device was removed: the emulator is tearing down */
                stop = 1;
                return;
            }
            die("read");
        }
        int j = destination(buf, (int)n, i);
        if (j < 0) {
            bad_packets++;
            continue;
        }
        struct packet *p = malloc(sizeof *p + n);
        if (!p) die("malloc");
        p->dst = j;
        p->len = (int)n;
        memcpy(p->data, buf, n);
        enter_link(&hosts[i].up, p, now_ns());
    }
}

static void deliver(struct packet *p, int64_t now) {
    struct host *h = &hosts[p->dst];
    int64_t late = now - p->due;
    int b = 0;
    while (b < kLateBuckets - 1 && late >= kLateBounds[b]) b++;
    h->late[b]++;
    if (late > h->late_max) h->late_max = late;
    if (write(h->fd, p->data, p->len) == p->len) h->written++;
    free(p);
}

/* Moves every packet whose due time has passed one stage on; returns the next due time
 * (INT64_MAX if none). Uplinks are drained in due order across hosts, so each downlink sees
 * its arrivals in time order. */
static int64_t advance(int64_t now) {
    for (;;) {
        int best = -1;
        for (int i = 0; i < nhosts; i++) {
            struct packet *p = hosts[i].up.head;
            if (p && p->due <= now && (best < 0 || p->due < hosts[best].up.head->due)) best = i;
        }
        if (best < 0) break;
        struct packet *p = pop(&hosts[best].up);
        enter_link(&hosts[p->dst].down, p, p->due);
    }
    int64_t next = INT64_MAX;
    for (int i = 0; i < nhosts; i++) {
        struct link *down = &hosts[i].down;
        while (down->head && down->head->due <= now) deliver(pop(down), now);
        if (down->head && down->head->due < next) next = down->head->due;
        if (hosts[i].up.head && hosts[i].up.head->due < next) next = hosts[i].up.head->due;
    }
    return next;
}

static void write_link(FILE *f, const char *name, const struct link *l) {
    fprintf(f, "\"%s\": {\"packets\": %llu, \"bytes\": %llu, \"lost\": %llu, \"queue_drops\": %llu}",
            name, (unsigned long long)l->packets, (unsigned long long)l->bytes,
            (unsigned long long)l->lost, (unsigned long long)l->queue_drops);
}

/* Counters per host as JSON, written to a temporary file renamed over stats_path so a reader
 * never sees half of it. */
static void write_stats(void) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", stats_path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "{\"bad_packets\": %llu, \"link_changes\": %llu, "
               "\"late_bounds_ns\": [10000, 100000, 1000000, 10000000], \"hosts\": [",
            (unsigned long long)bad_packets, (unsigned long long)link_changes);
    for (int i = 0; i < nhosts; i++) {
        const struct host *h = &hosts[i];
        fprintf(f, "%s\n {\"name\": \"%s\", ", i ? "," : "", h->name);
        write_link(f, "up", &h->up);
        fputs(", ", f);
        write_link(f, "down", &h->down);
        fprintf(f, ", \"written\": %llu, \"late_max_ns\": %lld, \"late\": [",
                (unsigned long long)h->written, (long long)h->late_max);
        for (int b = 0; b < kLateBuckets; b++)
            fprintf(f, "%s%llu", b ? ", " : "", (unsigned long long)h->late[b]);
        fputs("]}", f);
    }
    fputs("]}\n", f);
    fclose(f);
    rename(tmp, stats_path);
}

static void on_stop(int sig) { (void)sig; stop = 1; }
static void on_dump(int sig) { (void)sig; dump = 1; }
static void on_change(int sig) { (void)sig; change = 1; }

int main(int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        if (a + 1 >= argc) die(argv[a]);
        if (!strcmp(argv[a], "--host")) {
            parse_host(argv[++a]);
        } else if (!strcmp(argv[a], "--subnet")) {
            unsigned x, y, z;
            if (sscanf(argv[++a], "%u.%u.%u", &x, &y, &z) != 3 || x > 255 || y > 255 || z > 255)
                die("--subnet");
            subnet[0] = x, subnet[1] = y, subnet[2] = z;
        } else if (!strcmp(argv[a], "--seed")) {
            rng_state = strtoull(argv[++a], NULL, 0);
        } else if (!strcmp(argv[a], "--tick-ns")) {
            tick_ns = atoll(argv[++a]);
        } else if (!strcmp(argv[a], "--stats")) {
            stats_path = argv[++a];
        } else if (!strcmp(argv[a], "--control")) {
            control_path = argv[++a];
        } else {
            die(argv[a]);
        }
    }
    if (nhosts < 2 || !stats_path || !subnet[0]) die("needs --subnet, --stats and >= 2 --host");

    prctl(PR_SET_PDEATHSIG, SIGTERM);
    prctl(PR_SET_TIMERSLACK, 1000UL); /* wake within ~1 us of a due time, not the 50 us default */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_dump;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_change;
    sigaction(SIGUSR2, &sa, NULL);
    /* The signals stay blocked except inside ppoll, so none is missed between a check of the
     * flags and the wait. */
    sigset_t block, during_wait;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGUSR2);
    sigprocmask(SIG_BLOCK, &block, &during_wait);
    if (getppid() == 1) return 1; /* the parent died before PDEATHSIG was set */

    struct pollfd fds[kMaxHosts];
    for (int i = 0; i < nhosts; i++) {
        hosts[i].fd = open_tun(hosts[i].name);
        fds[i].fd = hosts[i].fd;
        fds[i].events = POLLIN;
    }
    printf("ready\n");
    fflush(stdout);

    int64_t last_wake = 0;
    while (!stop) {
        if (change) {
            change = 0;
            apply_changes();
        }
        if (dump) {
            dump = 0;
            write_stats();
        }
        int64_t now = now_ns();
        if (now - last_wake < tick_ns) { /* busy: let a few packets gather, then take them all */
            int64_t until = last_wake + tick_ns;
            struct timespec ts = {until / 1000000000, until % 1000000000};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            now = now_ns();
        }
        last_wake = now;
        for (int i = 0; i < nhosts; i++) read_host(i);
        int64_t next = advance(now_ns());
        struct timespec wait, *timeout = NULL;
        if (next != INT64_MAX) {
            now = now_ns();
            int64_t d = next > now ? next - now : 0;
            wait.tv_sec = d / 1000000000;
            wait.tv_nsec = d % 1000000000;
            timeout = &wait;
        }
        if (ppoll(fds, nhosts, timeout, &during_wait) < 0 && errno != EINTR) die("ppoll");
    }
    write_stats();
    return 0;
}
