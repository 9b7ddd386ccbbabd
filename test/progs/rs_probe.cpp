// A probe of the preload tests' own set-up, for the sanitizer builds above all:
//
//   rs_probe linkmap   prints "OBJ <path>" for every loaded object, in the
//                      order of the link map (the order in which a symbol
//                      such as connect() is looked up), then "DONE";
//   rs_probe bug       commits one bug of each kind the sanitizers catch (a
//                      data race, a signed overflow, a heap overflow), so
//                      that the harness can prove that a report in a
//                      spawned process fails the test. Without a sanitizer
//                      the bugs go unnoticed and it exits 0.
#include <link.h>
#include <stdio.h>
#include <string.h>

#include <climits>
#include <thread>

namespace {

int list_objects() {
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void*) {
        if (info->dlpi_name && info->dlpi_name[0]) printf("OBJ %s\n", info->dlpi_name);
        return 0;
      },
      nullptr);
  printf("DONE\n");
  return 0;
}

int g_racy = 0;

int commit_bugs() {
  // A race: two threads write g_racy with nothing ordering them (TSan).
  std::thread t([] { g_racy = 1; });
  g_racy = 2;
  t.join();
  // A signed overflow (UBSan stops here).
  volatile int big = INT_MAX;
  volatile int sum = big + g_racy;
  // One byte past a heap block (ASan stops here; without ASan the byte is
  // in the allocator's padding).
  char* block = new char[13];
  memset(block, 0, 13);
  volatile int index = 13;
  volatile char past = block[index];
  delete[] block;
  printf("RESULT sum=%d past=%d\n", sum, past);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "linkmap") == 0) return list_objects();
  if (argc == 2 && strcmp(argv[1], "bug") == 0) return commit_bugs();
  fprintf(stderr, "usage: rs_probe linkmap|bug\n");
  return 2;
}
