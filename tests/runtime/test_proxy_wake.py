"""The proxy waker against a thread that does what NCCL's UDS service thread does (``ncclProxyServiceUDS``:
``poll()`` one Unix datagram socket with a 500 ms timeout, check the stop flag when the poll returns) and a
destroy that does what ``ncclCommDestroy`` does (set the flag, ``pthread_join`` the thread), compiled from C so
the join is glibc's ``pthread_join`` and the poll a real ``poll``. Without the waker the join waits out the poll
(up to 0.5 s); with it the join returns in milliseconds, and a thread that is not being joined is never woken."""
import ctypes
import shutil
import subprocess
import threading
import time

import pytest

from refimpl.torch_runtime import proxy_wake

C_SOURCE = r"""
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct uds { int fd; atomic_int stop; atomic_int reads; pthread_t th; };

static void *serve(void *arg) {
  struct uds *u = arg;
  struct pollfd p = { .fd = u->fd, .events = POLLIN | POLLHUP };
  while (1) {
    int ret;
    do { ret = poll(&p, 1, 500); } while (ret < 0);
    if (atomic_load(&u->stop)) break;
    if (p.revents) { char buf[64]; recv(u->fd, buf, sizeof buf, 0); atomic_fetch_add(&u->reads, 1); }
  }
  close(u->fd);
  return NULL;
}

struct uds *uds_start(const char *name) {
  static struct uds pool[16]; static int n = 0;
  struct uds *u = &pool[n++];
  struct sockaddr_un a; memset(&a, 0, sizeof a); a.sun_family = AF_UNIX;
  strncpy(a.sun_path + 1, name, sizeof a.sun_path - 2);  /* abstract, as NCCL's */
  u->fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  if (bind(u->fd, (struct sockaddr *)&a, sizeof a) != 0) return NULL;
  atomic_store(&u->stop, 0); atomic_store(&u->reads, 0);
  pthread_create(&u->th, NULL, serve, u);
  /* unnamed: NCCL names its threads only with NCCL_SET_THREAD_NAME=1; the waker knows it by its 500 ms poll */
  return u;
}

void uds_destroy(struct uds *u) { atomic_store(&u->stop, 1); pthread_join(u->th, NULL); }
int uds_reads(struct uds *u) { return atomic_load(&u->reads); }
"""

pytestmark = pytest.mark.skipif(not proxy_wake.supported() or shutil.which("gcc") is None,
                                reason="needs Linux /proc on x86_64 or aarch64 and gcc")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("uds")
    (d / "uds.c").write_text(C_SOURCE)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(d / "libuds.so"), str(d / "uds.c")],
                   check=True)
    lib = ctypes.CDLL(str(d / "libuds.so"))  # CDLL calls release the GIL: the watcher runs during the join
    lib.uds_start.restype = ctypes.c_void_p
    lib.uds_start.argtypes = [ctypes.c_char_p]
    lib.uds_destroy.argtypes = [ctypes.c_void_p]
    lib.uds_reads.argtypes = [ctypes.c_void_p]
    return lib


def _destroy_time(lib, u, wake: bool) -> float:
    time.sleep(0.05)  # the thread is in its poll
    t0 = time.perf_counter()
    if wake:
        with proxy_wake.ProxyWaker() as w:
            lib.uds_destroy(u)
        assert w.woken == 1
    else:
        lib.uds_destroy(u)
    return time.perf_counter() - t0


def test_destroy_waits_for_the_poll_without_the_waker(lib):
    u = lib.uds_start(b"timeshare-test-uds-plain")
    assert u
    assert _destroy_time(lib, u, wake=False) > 0.2  # the rest of a 500 ms poll (it started 50 ms before)


def test_waker_ends_the_join_at_once_and_the_thread_reads_nothing(lib):
    times = []
    for i in range(3):
        u = lib.uds_start(f"timeshare-test-uds-wake-{i}".encode())
        assert u
        times.append(_destroy_time(lib, u, wake=True))
        assert lib.uds_reads(u) == 0  # it saw its stop flag first: the datagram was never read as a request
    assert max(times) < 0.1, times


def test_a_live_thread_that_is_not_joined_is_never_woken(lib):
    live = lib.uds_start(b"timeshare-test-uds-live")
    gone = lib.uds_start(b"timeshare-test-uds-gone")
    assert live and gone
    _destroy_time(lib, gone, wake=True)
    time.sleep(0.6)  # a whole poll period: a stray datagram would have been read by now
    assert lib.uds_reads(live) == 0
    lib.uds_destroy(live)


def test_waker_does_nothing_when_the_thread_joins_something_else():
    done = threading.Event()
    worker = threading.Thread(target=done.wait, name="not-nccl")
    worker.start()
    with proxy_wake.ProxyWaker() as w:
        time.sleep(0.02)
        done.set()
        worker.join()
    assert w.woken == 0
