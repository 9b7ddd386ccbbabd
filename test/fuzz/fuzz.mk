# libFuzzer targets (test/fuzz/README.md), included by the top-level
# Makefile. Every test/fuzz/NAME_fuzz.cpp is one target, built with clang,
# ASan and UBSan into $(FUZZ_BUILD)/NAME_fuzz together with the sources its
# "// fuzz-sources:" line names. `make fuzz` builds and runs each target for
# FUZZ_SECONDS; `make fuzz-build` only builds them.

FUZZ_CXX     ?= clang++-14
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CXXFLAGS := -std=c++20 -O1 -g -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter \
                 -pthread -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_LDLIBS   := -ldl -libverbs -lrdmacm -pthread

FUZZ_TARGETS := $(sort $(patsubst test/fuzz/%_fuzz.cpp,%,$(wildcard test/fuzz/*_fuzz.cpp)))
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/%_fuzz)
# The library sources a target links: its "// fuzz-sources: a.cpp b.cpp" line.
fuzz_sources = $(shell sed -n 's|^// fuzz-sources:||p' test/fuzz/$(1)_fuzz.cpp)

.PHONY: fuzz fuzz-build
fuzz-build: $(FUZZ_BINS)

fuzz: deps fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_BUILD=$(FUZZ_BUILD) bash test/fuzz/run.sh

$(FUZZ_BUILD)/obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

define FUZZ_LINK_RULE
$(FUZZ_BUILD)/$(1)_fuzz: $(FUZZ_BUILD)/obj/test/fuzz/$(1)_fuzz.o \
    $(patsubst %.cpp,$(FUZZ_BUILD)/obj/%.o,$(call fuzz_sources,$(1)))
	$$(FUZZ_CXX) $$(FUZZ_CXXFLAGS) -fsanitize=fuzzer -o $$@ $$^ $$(FUZZ_LDLIBS)
endef
$(foreach t,$(FUZZ_TARGETS),$(eval $(call FUZZ_LINK_RULE,$(t))))

-include $(shell find $(FUZZ_BUILD)/obj -name '*.d' 2>/dev/null)

.PHONY: fuzz-clean
clean: fuzz-clean
fuzz-clean:
	rm -rf $(FUZZ_BUILD)
