# librsock build. `make` builds build/librsock.so; `make test` installs missing
# Debian packages, builds and runs every test tier; `make bench` runs the A/B
# benchmark against kernel TCP. See README.md.

CXX      ?= g++
BUILD    ?= build
OPT      ?= -O2
CXXFLAGS += -std=c++20 $(OPT) -g -fPIC -Wall -Wextra -Wno-unused-parameter \
            -fvisibility=hidden -fno-plt -pthread -Iinclude -Isrc
LDLIBS_SO = -ldl -libverbs -lrdmacm -pthread

# Everything under src/ except the exported wrappers forms the core, which the
# unit tests link directly (linking the wrappers would interpose the tests' own
# libc calls).
CORE_SRCS  := $(shell find src -name '*.cpp' -not -path 'src/interpose/*' | sort)
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

.PHONY: all test test-unit test-preload test-apps test-rdma bench deps clean format
all: $(BUILD)/librsock.so $(PROGS) $(APP_PROGS) $(TEST_LIBS)

$(BUILD)/obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/librsock.a: $(CORE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/librsock.so: $(SHIM_OBJS) $(BUILD)/librsock.a src/interpose/exports.map
	$(CXX) -shared -o $@ $(SHIM_OBJS) -Wl,--whole-archive $(BUILD)/librsock.a -Wl,--no-whole-archive \
	  -Wl,--version-script=src/interpose/exports.map -Wl,-z,now -Wl,-z,relro $(LDLIBS_SO)

$(BUILD)/unit_tests: $(UNIT_SRCS:%.cpp=$(BUILD)/obj/%.o) $(BUILD)/librsock.a
	$(CXX) -o $@ $^ $(GTEST_LIBS) $(LDLIBS_SO)

$(BUILD)/preload_tests: $(PRELOAD_SRCS:%.cpp=$(BUILD)/obj/%.o)
	$(CXX) -o $@ $^ $(GTEST_LIBS)

$(BUILD)/progs/%: test/progs/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 -O2 -g -Wall -Wextra -pthread -o $@ $<

# The application tier's own servers are C programs (test/apps/*.c).
$(BUILD)/apps/%: test/apps/%.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -Wall -Wextra -pthread -o $@ $<

$(BUILD)/progs/lib%.so: test/libs/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 -O2 -g -Wall -Wextra -shared -fPIC -o $@ $<

deps:
	@bash .ci/deps.sh

test: deps all $(BUILD)/unit_tests $(BUILD)/preload_tests
	@bash test/run_all.sh

test-unit: $(BUILD)/unit_tests
	$(BUILD)/unit_tests

test-preload: all $(BUILD)/preload_tests
	$(BUILD)/preload_tests

test-rdma: deps all
	@bash test/rdma/run.sh && bash test/rdma/verbs.sh

bench: deps all
	@bash benchmarks/run.sh

format:
	clang-format -i $$(find src include test benchmarks -name '*.cpp' -o -name '*.h')

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# libFuzzer targets: make fuzz, make fuzz-build (test/fuzz/README.md).
include test/fuzz/fuzz.mk
