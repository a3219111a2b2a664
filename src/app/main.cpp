// rlfusion: one SPMD program; every rank runs this main.
#include <cstdio>

int main(int argc, char** argv) {
  std::puts("rlfusion: skeleton");
  return 0;
}
