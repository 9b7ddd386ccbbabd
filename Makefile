# librsock build. `make` builds build/librsock.so; `make test` installs missing
# Debian packages, builds and runs every test tier; `make bench` runs the A/B
# benchmark against kernel TCP. `make asan`, `make ubsan`, `make tsan` build
# everything with a sanitizer in build-asan/, build-ubsan/, build-tsan/ and run
# the unit and preload tiers there (test/sanitize/run.sh). See README.md.

CXX      ?= g++
BUILD    ?= build
VERSION  := 0.9.0

# SANITIZE=address, undefined or thread instruments the library, the tests
# and the test programs alike (a preloaded library and the program it is
# preloaded into must share one runtime). Use a BUILD folder of its own:
# objects of different instrumentation must never mix. -O1 keeps stacks
# readable and the build quicker; UBSan stops at its first report, so that
# no report can scroll by in a process whose exit status nobody reads.
SANITIZE ?=
ifneq ($(SANITIZE),)
OPT       ?= -O1
SAN_FLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
ifeq ($(SANITIZE),undefined)
SAN_FLAGS += -fno-sanitize-recover=undefined
endif
# TSan does not model std::atomic_thread_fence (-Wtsan says so at each one).
# Ours (shm_channel.cpp, pending.cpp) only order a store before a load in a
# Dekker handshake (a wakeup, a hand-over), never publish plain data: that
# goes through release/acquire pairs and locks, which TSan sees. So the
# warning is known and silenced, and new ones do not hide among it.
ifeq ($(SANITIZE),thread)
SAN_FLAGS += -Wno-tsan
endif
endif

OPT      ?= -O2
CXXFLAGS += -std=c++20 $(OPT) -g -fPIC -Wall -Wextra -Wno-unused-parameter \
            -fvisibility=hidden -fno-plt -pthread -Iinclude -Isrc $(SAN_FLAGS)
LDFLAGS  += $(SAN_FLAGS)
LDLIBS_SO = -ldl -libverbs -lrdmacm -pthread
# The test programs and test libraries: standalone, without the library's
# include paths and visibility.
PROG_CXXFLAGS = -std=c++20 $(OPT) -g -Wall -Wextra -pthread -Iinclude $(SAN_FLAGS)

# Everything under src/ except the exported wrappers forms the core, which the
# unit tests link directly (linking the wrappers would interpose the tests' own
# libc calls).
CORE_SRCS  := $(shell find src -name '*.cpp' -not -path 'src/interpose/*' -not -path 'src/tools/*' | sort)
SHIM_SRCS  := $(shell find src/interpose -name '*.cpp' | sort)
CORE_OBJS  := $(CORE_SRCS:%.cpp=$(BUILD)/obj/%.o)
SHIM_OBJS  := $(SHIM_SRCS:%.cpp=$(BUILD)/obj/%.o)
UNIT_SRCS  := $(sort $(wildcard test/unit/*.cpp))
PRELOAD_SRCS := $(sort $(wildcard test/preload/*.cpp))
PROG_SRCS  := $(sort $(wildcard test/progs/*.cpp))
PROGS      := $(PROG_SRCS:test/progs/%.cpp=$(BUILD)/progs/%)
APP_PROGS  := $(patsubst test/apps/%.c,$(BUILD)/apps/%,$(sort $(wildcard test/apps/*.c)))
TEST_LIBS  := $(patsubst test/libs/%.cpp,$(BUILD)/progs/lib%.so,$(sort $(wildcard test/libs/*.cpp)))
GTEST_LIBS := -lgtest -lgtest_main -pthread

.PHONY: all test test-unit test-preload test-apps test-rdma bench deps clean format \
        asan ubsan tsan asan-build ubsan-build tsan-build install uninstall
all: $(BUILD)/librsock.so $(BUILD)/rsock-run $(BUILD)/rsockstat $(BUILD)/rsock-h.checked $(PROGS) \
     $(APP_PROGS) $(TEST_LIBS)

# Plain make on a machine without the build packages names them (and the
# command that installs them) rather than failing on a missing header.
$(BUILD)/.build-deps: .ci/deps.sh
	@bash .ci/deps.sh build
	@mkdir -p $(dir $@) && touch $@

# The version that include/rsock.h's rsock_version() returns.
$(BUILD)/obj/src/interpose/public_api.o: CXXFLAGS += -DRSOCK_VERSION='"$(VERSION)"'
$(BUILD)/obj/src/interpose/public_api.o: Makefile

$(BUILD)/obj/%.o: %.cpp | $(BUILD)/.build-deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/librsock.a: $(CORE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/librsock.so: $(SHIM_OBJS) $(BUILD)/librsock.a src/interpose/exports.map
	$(CXX) -shared $(LDFLAGS) -o $@ $(SHIM_OBJS) -Wl,--whole-archive $(BUILD)/librsock.a -Wl,--no-whole-archive \
	  -Wl,--version-script=src/interpose/exports.map -Wl,-z,now -Wl,-z,relro $(LDLIBS_SO)

# The public header is C too: it must compile as C11, pedantic, warning-free
# (test/progs/rs_info.cpp uses it from C++).
$(BUILD)/rsock-h.checked: include/rsock.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -Wall -Wextra -pedantic -Werror -Iinclude -fsyntax-only -x c $<
	@touch $@

# rsock-run, beside the library (it finds it there, or in ../lib installed).
$(BUILD)/rsock-run: src/tools/rsock-run.sh Makefile
	@mkdir -p $(dir $@)
	sed 's/@VERSION@/$(VERSION)/' $< > $@.tmp && chmod 755 $@.tmp && mv $@.tmp $@

# rsockstat reads the files librsock publishes (their layout: src/stats/publish.h).
$(BUILD)/rsockstat: src/tools/rsockstat.cpp src/stats/publish.h Makefile | $(BUILD)/.build-deps
	@mkdir -p $(dir $@)
	$(CXX) $(PROG_CXXFLAGS) -Isrc -DRSOCK_VERSION='"$(VERSION)"' $(LDFLAGS) -o $@ $<

$(BUILD)/unit_tests: $(UNIT_SRCS:%.cpp=$(BUILD)/obj/%.o) $(BUILD)/librsock.a
	$(CXX) $(LDFLAGS) -o $@ $^ $(GTEST_LIBS) $(LDLIBS_SO)

$(BUILD)/preload_tests: $(PRELOAD_SRCS:%.cpp=$(BUILD)/obj/%.o)
	$(CXX) $(LDFLAGS) -o $@ $^ $(GTEST_LIBS)

$(BUILD)/progs/%: test/progs/%.cpp test/progs/progs.h include/rsock.h
	@mkdir -p $(dir $@)
	$(CXX) $(PROG_CXXFLAGS) $(LDFLAGS) -o $@ $<

# The application tier's own servers are C programs (test/apps/*.c).
$(BUILD)/apps/%: test/apps/%.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(OPT) -g -Wall -Wextra -pthread $(LDFLAGS) -o $@ $<

$(BUILD)/progs/lib%.so: test/libs/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(PROG_CXXFLAGS) -shared -fPIC $(LDFLAGS) -o $@ $<

deps:
	@bash .ci/deps.sh

test: deps all $(BUILD)/unit_tests $(BUILD)/preload_tests
	@bash test/run_all.sh

test-unit: $(BUILD)/unit_tests $(BUILD)/rsock-run
	$(BUILD)/unit_tests

test-preload: all $(BUILD)/preload_tests
	$(BUILD)/preload_tests

test-rdma: deps all
	@bash test/rdma/run.sh && bash test/rdma/verbs.sh

# The sanitizer tiers: build-<name>/ with SANITIZE=<sanitizer>, then the unit
# and preload tiers under it (test/run_all.sh, TIERS=<name>). One test under
# one sanitizer: make tsan GTEST_FILTER='SemanticsTest.*', or, once built,
# test/sanitize/run.sh tsan preload --gtest_filter='SemanticsTest.*'.
SAN_asan  := address
SAN_ubsan := undefined
SAN_tsan  := thread
asan-build ubsan-build tsan-build: %-build:
	$(MAKE) BUILD=build-$* SANITIZE=$(SAN_$*) all build-$*/unit_tests build-$*/preload_tests

asan ubsan tsan:
	@TIERS=$@ bash test/run_all.sh

bench: deps all
	@bash benchmarks/run.sh

format:
	clang-format -i $$(find src include test benchmarks -name '*.cpp' -o -name '*.h')

clean:
	rm -rf $(BUILD) build-asan build-ubsan build-tsan

# make install PREFIX=... DESTDIR=...: the library, rsock-run (which finds
# the library in ../lib), rsockstat, include/rsock.h, the man pages, the example rule
# file and a pkg-config file; make uninstall (the same variables) removes
# them.
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib
MANDIR  ?= $(PREFIX)/share/man
DOCDIR  ?= $(PREFIX)/share/doc/librsock
INCLUDEDIR ?= $(PREFIX)/include
INSTALLED := $(LIBDIR)/librsock.so $(BINDIR)/rsock-run $(BINDIR)/rsockstat $(INCLUDEDIR)/rsock.h \
             $(MANDIR)/man1/rsock-run.1 $(MANDIR)/man1/rsockstat.1 $(MANDIR)/man7/librsock.7 \
             $(DOCDIR)/rsock.conf $(LIBDIR)/pkgconfig/librsock.pc

install: $(BUILD)/librsock.so $(BUILD)/rsock-run $(BUILD)/rsockstat
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) \
	  $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man7 $(DESTDIR)$(DOCDIR)
	install -m 755 $(BUILD)/librsock.so $(DESTDIR)$(LIBDIR)/librsock.so
	install -m 755 $(BUILD)/rsock-run $(DESTDIR)$(BINDIR)/rsock-run
	install -m 755 $(BUILD)/rsockstat $(DESTDIR)$(BINDIR)/rsockstat
	install -m 644 include/rsock.h $(DESTDIR)$(INCLUDEDIR)/rsock.h
	sed 's/@VERSION@/$(VERSION)/' docs/man/rsock-run.1 > $(DESTDIR)$(MANDIR)/man1/rsock-run.1
	sed 's/@VERSION@/$(VERSION)/' docs/man/rsockstat.1 > $(DESTDIR)$(MANDIR)/man1/rsockstat.1
	sed 's/@VERSION@/$(VERSION)/' docs/man/librsock.7 > $(DESTDIR)$(MANDIR)/man7/librsock.7
	chmod 644 $(DESTDIR)$(MANDIR)/man1/rsock-run.1 $(DESTDIR)$(MANDIR)/man1/rsockstat.1 \
	  $(DESTDIR)$(MANDIR)/man7/librsock.7
	install -m 644 conf/rsock.conf $(DESTDIR)$(DOCDIR)/rsock.conf
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' \
	  'preload=$${libdir}/librsock.so' '' 'Name: librsock' \
	  'Description: TCP streams of unmodified programs over shared memory and RDMA (LD_PRELOAD)' \
	  'Version: $(VERSION)' 'Cflags: -I$${includedir}' > $(DESTDIR)$(LIBDIR)/pkgconfig/librsock.pc

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(DOCDIR) 2>/dev/null

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# libFuzzer targets: make fuzz, make fuzz-build (test/fuzz/README.md).
include test/fuzz/fuzz.mk
