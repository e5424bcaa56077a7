/* cc_shim: LD_PRELOAD library that starts every new TCP socket with one congestion control,
 * as a host whose default is that algorithm would (this VM defaults to bbr, most Linux hosts
 * to cubic, and a network namespace's own default cannot be changed here). The algorithm is
 * $WAN_TCP_CONGESTION, cubic if unset. A program may still choose another one later with its
 * own setsockopt; accepted connections inherit their listening socket's choice.
 *
 *   cc -O2 -shared -fPIC -o libcc_shim.so cc_shim.c -ldl
 *   LD_PRELOAD=$PWD/libcc_shim.so python ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int socket(int domain, int type, int protocol) {
    static int (*real_socket)(int, int, int);
    if (!real_socket) real_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    int fd = real_socket(domain, type, protocol);
    int base_type = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0 && (domain == AF_INET || domain == AF_INET6) && base_type == SOCK_STREAM &&
        (protocol == 0 || protocol == IPPROTO_TCP)) {
        const char *name = getenv("WAN_TCP_CONGESTION");
        if (!name || !*name) name = "cubic";
        setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name));
    }
    return fd;
}
