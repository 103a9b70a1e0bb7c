/* The pod sandbox's process (containerd's sandbox_image; cluster.sh builds it
 * with gcc -static, no registry here to pull registry.k8s.io/pause from):
 * holds the pod's namespaces, reaps zombies, exits on SIGTERM or SIGINT. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static void on_term(int s) { (void)s; _exit(0); }
static void on_chld(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term;
  sigaction(SIGINT, &sa, 0);
  sigaction(SIGTERM, &sa, 0);
  sa.sa_handler = on_chld;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, 0);
  for (;;) pause();
}
