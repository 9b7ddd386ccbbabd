// benchmarks/report.sh, which `make bench` runs at its end: from the data
// files the benchmark scripts write (medians with their spread) it draws
// PNG plots with gnuplot and writes report.md, which embeds them above the
// run's tables. Here it runs on data files the test writes, so that what
// it must compute (each row's ratio) is known; the benchmark itself is too
// long for `make test` and is run by hand (README, Benchmark).
#include <sys/stat.h>

#include <fstream>

#include "harness.h"

namespace rsock_test {
namespace {

const char* const kPlots[] = {"latency-percentiles.png", "throughput-by-size.png", "conn-rate.png",
                              "app-ratios.png"};

class BenchReportTest : public PreloadTest {
 protected:
  std::string root() const { return lib().substr(0, lib().rfind('/', lib().rfind('/') - 1)); }
  // A bench directory of the scratch folder, with a data/ folder.
  std::string bench_dir(const std::string& name) {
    const std::string d = dir() + "/" + name;
    EXPECT_EQ(mkdir(d.c_str(), 0755), 0);
    EXPECT_EQ(mkdir((d + "/data").c_str(), 0755), 0);
    return d;
  }
  static void write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  // Runs report.sh on d; its exit status, or -1.
  int report(const std::string& label, const std::string& d, Proc** out) {
    Proc& p = spawn(label, "/bin/bash", {root() + "/benchmarks/report.sh", d}, {});
    *out = &p;
    if (!wait_exit(p, 60000) || !p.reaped || !WIFEXITED(p.status)) return -1;
    return WEXITSTATUS(p.status);
  }
  static std::string percentiles() {
    return "iomux\tpath\tpercentile\tus\n"
           "default\ttcp\t50.000\t13.7\n"
           "default\ttcp\t99.000\t24.4\n"
           "default\trsock\t50.000\t0.44\n"
           "default\trsock\t99.000\t0.61\n"
           "epoll\ttcp\t50.000\t15.1\n"
           "epoll\trsock\t50.000\t0.52\n";
  }
};

// Whether path is a PNG file of some substance.
bool is_png(const std::string& path) {
  const std::string s = read_file(path);
  return s.size() > 2000 && s.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0;
}

// Every plot from a full set of data, each embedded in the report with the
// table of ratios (librsock/TCP for rates, TCP/librsock for latencies), the
// rows measured invalidly left out of it, and the run's tables after them.
TEST_F(BenchReportTest, PlotsEveryMeasurementAndEmbedsThem) {
  const std::string d = bench_dir("full");
  write(d + "/data/percentiles.tsv", percentiles());
  write(d + "/data/apps.tsv",
        "row\tmetric\tpath\tmedian\tmin\tmax\tvalid\n"
        "redis-c1\tGET.rps\ttcp\t20000\t19000\t21000\t1\n"
        "redis-c1\tGET.rps\trsock\t100000\t90000\t110000\t1\n"
        "java-echo\tp50\ttcp\t30\t29\t35\t1\n"
        "java-echo\tp50\trsock\t1.5\t1.4\t1.7\t1\n"
        "conns-block\trate\ttcp\t12000\t11500\t12500\t1\n"
        "conns-block\trate\trsock\t11000\t10000\t12000\t1\n"
        "conns-epoll\trate\ttcp\t10000\t9000\t11000\t1\n"
        "conns-epoll\trate\trsock\t9000\t8000\t9500\t0\n"
        "stream-64\tmbs\ttcp\t90\t80\t95\t1\n"
        "stream-64\tmbs\trsock\t200\t180\t210\t1\n"
        "stream-1048576\tmbs\ttcp\t4000\t3800\t4100\t1\n"
        "stream-1048576\tmbs\trsock\t12000\t8000\t14000\t1\n");
  write(d + "/results.md", "# librsock vs kernel TCP (sockperf)\n\n| path | p50 us |\n");
  write(d + "/apps.md", "## Applications: librsock (shm) vs kernel TCP\n");
  Proc* p = nullptr;
  ASSERT_EQ(report("report", d, &p), 0) << p->describe();
  for (const char* f : kPlots) EXPECT_TRUE(is_png(d + "/plots/" + f)) << f << " " << p->describe();
  const std::string md = read_file(d + "/report.md");
  for (const char* f : kPlots)
    EXPECT_NE(md.find(std::string("](plots/") + f + ")"), std::string::npos) << f << "\n" << md;
  EXPECT_NE(md.find("I/O mode default"), std::string::npos) << md;
  EXPECT_NE(md.find("| redis-c1 (GET.rps) | 5.00x |"), std::string::npos) << md;
  EXPECT_NE(md.find("| java-echo (p50) | 20.00x |"), std::string::npos) << md;
  EXPECT_NE(md.find("| conns-block (rate) | 0.92x |"), std::string::npos) << md;
  EXPECT_NE(md.find("| stream-1048576 (mbs) | 3.00x |"), std::string::npos) << md;
  EXPECT_EQ(md.find("conns-epoll (rate)"), std::string::npos) << "an invalid row's ratio\n" << md;
  EXPECT_EQ(md.find("left out"), std::string::npos) << md;
  // The tables, one heading level down, the sockperf one first.
  const size_t sock = md.find("\n## librsock vs kernel TCP (sockperf)\n");
  const size_t apps = md.find("\n### Applications: librsock (shm) vs kernel TCP\n");
  ASSERT_NE(sock, std::string::npos) << md;
  ASSERT_NE(apps, std::string::npos) << md;
  EXPECT_LT(sock, apps);
  EXPECT_LT(md.find("app-ratios.png"), sock);
}

// A run that measured only sockperf (BENCH_APPS chose no row, or apps.sh
// could not run): the latency plot, and the others named as left out, why.
TEST_F(BenchReportTest, SaysWhichPlotsItLeftOut) {
  const std::string d = bench_dir("part");
  write(d + "/data/percentiles.tsv", percentiles());
  Proc* p = nullptr;
  ASSERT_EQ(report("report", d, &p), 0) << p->describe();
  EXPECT_TRUE(is_png(d + "/plots/latency-percentiles.png"));
  const std::string md = read_file(d + "/report.md");
  EXPECT_NE(md.find("](plots/latency-percentiles.png)"), std::string::npos) << md;
  for (const char* f : {"throughput-by-size.png", "conn-rate.png", "app-ratios.png"}) {
    EXPECT_NE(access((d + "/plots/" + f).c_str(), F_OK), 0) << f;
    EXPECT_NE(md.find(std::string("- ") + f + ": no application rows in this run"),
              std::string::npos)
        << f << "\n"
        << md;
  }
}

// Bad input is a clear error (status 2, the file and line named) that
// writes no report: a directory with no data, a malformed data file.
TEST_F(BenchReportTest, BadDataIsAClearError) {
  Proc* p = nullptr;
  const std::string empty = bench_dir("empty");
  EXPECT_EQ(report("empty", empty, &p), 2) << p->describe();
  EXPECT_NE(p->err().find("holds no data file"), std::string::npos) << p->err();
  EXPECT_EQ(report("missing", dir() + "/nowhere", &p), 2) << p->describe();
  EXPECT_NE(p->err().find("no such directory"), std::string::npos) << p->err();
  const std::string bad = bench_dir("bad");
  write(bad + "/data/percentiles.tsv", percentiles());
  write(bad + "/data/apps.tsv",
        "row\tmetric\tpath\tmedian\tmin\tmax\tvalid\n"
        "redis-c1\tGET.rps\ttcp\t20000\t19000\t21000\t1\n"
        "redis-c1\tGET.rps\trsock\tfast\t90000\t110000\t1\n");
  EXPECT_EQ(report("bad", bad, &p), 2) << p->describe();
  EXPECT_NE(p->err().find("apps.tsv line 3: field 4 is not a number: fast"), std::string::npos)
      << p->err();
  EXPECT_NE(access((bad + "/report.md").c_str(), F_OK), 0) << "a report from bad data";
  write(bad + "/data/apps.tsv", "row\tmetric\tpath\tmedian\tmin\tmax\tvalid\nredis-c1\t1\t2\n");
  EXPECT_EQ(report("short", bad, &p), 2) << p->describe();
  EXPECT_NE(p->err().find("apps.tsv line 2: 3 fields, not 7"), std::string::npos) << p->err();
}

}  // namespace
}  // namespace rsock_test
