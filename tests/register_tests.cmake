# Registers every test program's tests with CTest, each labelled with its tier (tiers.cmake) and its folder. CTest
# runs this when it loads the tests; tests/CMakeLists.txt names the programs in tandem_test_programs (folder, path,
# folder, path, ...) and the folder they run in.
#
# The tests of one suite and tier share one entry (`DdpParity.*`), run in one process with `--gtest_filter`: starting
# a test program, which loads LibTorch, takes longer than most tests do, fast or not, and the bad-input tables alone
# are over 200 rows that each start `tandem` once. A suite whose tests span tiers has an entry per tier
# (`FsdpShardedCheckpoint.* (processes)`), and a suite that builds something once for all its tests
# (`RendezvousSimulation`'s simulation) builds it once. The `hosts` and `gpu` tests stay one entry per test, as gtest
# names it, so that each shows as skipped on its own on a machine without root or a GPU. An
# entry's deadline is 300 s per test it runs; each test that starts processes also has its own deadline inside. A
# failing entry ends with gtest's list of the tests that failed.
#
# Each program's list of tests is kept beside it and read again only when the program is newer.
include("${CMAKE_CURRENT_LIST_DIR}/tiers.cmake")

# gtest's --gtest_list_tests output as "Suite.Test" names; a parameterised test's printed parameter is left out.
function(tandem_list_tests program list_file out_var)
  if(NOT EXISTS "${list_file}" OR "${program}" IS_NEWER_THAN "${list_file}")
    execute_process(COMMAND "${program}" --gtest_list_tests
                    OUTPUT_VARIABLE listed RESULT_VARIABLE status TIMEOUT 60)
    if(NOT status EQUAL 0)
      set(${out_var} "" PARENT_SCOPE)
      return()
    endif()
    file(WRITE "${list_file}" "${listed}")
  endif()
  file(READ "${list_file}" listed)
  # Only the printed parameters hold list separators and brackets; they are dropped below anyway.
  string(REGEX REPLACE "[][;]" "_" listed "${listed}")
  string(REPLACE "\n" ";" lines "${listed}")
  set(names "")
  set(suite "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^  +([^ ]+)")
      list(APPEND names "${suite}.${CMAKE_MATCH_1}")
    elseif(line MATCHES "^([^ ]+)\\.( +#.*)?$")
      set(suite "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out_var} "${names}" PARENT_SCOPE)
endfunction()

function(tandem_tier_of name out_var)
  foreach(tier IN LISTS tandem_test_tiers)
    if(name MATCHES "${tandem_tier_regex_${tier}}")
      set(${out_var} ${tier} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_var} fast PARENT_SCOPE)
endfunction()

# The tiers whose every test is an entry of its own.
set(tandem_tiers_one_entry_per_test hosts gpu)

function(tandem_add_entry entry program filter tier folder test_count)
  math(EXPR deadline "300 * ${test_count}")
  add_test("${entry}" "${program}" "--gtest_filter=${filter}")
  set_tests_properties("${entry}" PROPERTIES LABELS "${tier};${folder}" TIMEOUT ${deadline}
                       WORKING_DIRECTORY "${tandem_test_working_dir}")
  # CTest reports an entry whose output shows a skip as skipped even when it failed, so only an entry of one test
  # may say so; a suite's entry passes with its skipped tests named in gtest's summary.
  if(test_count EQUAL 1)
    set_tests_properties("${entry}" PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endif()
endfunction()

# One program's entries. A function, so that its per-suite lists end with it: two programs may have suites of one
# name. `tandem_entries` (the names taken so far) goes back to the caller.
function(tandem_register_program folder program)
  tandem_list_tests("${program}" "${program}.tests" names)
  if(NOT names)
    # Not built, or it failed to list its tests: an entry that fails, saying so, instead of tests that vanish.
    add_test("tandem_${folder}_tests.CannotListItsTests" "${program}" --gtest_list_tests)
    set_tests_properties("tandem_${folder}_tests.CannotListItsTests" PROPERTIES LABELS "fast;${folder}")
    return()
  endif()
  # Group the names by suite and tier; a suite's tiers are remembered in the order met.
  set(groups "")
  foreach(name IN LISTS names)
    tandem_tier_of("${name}" tier)
    string(REGEX REPLACE "\\.[^.]*$" "" suite "${name}")
    string(MAKE_C_IDENTIFIER "${suite}" suite_id)
    list(APPEND tests_${suite_id} "${name}")
    list(FIND tandem_tiers_one_entry_per_test ${tier} one_entry_per_test)
    if(NOT one_entry_per_test EQUAL -1)
      tandem_add_entry("${name}" "${program}" "${name}" ${tier} ${folder} 1)
      continue()
    endif()
    list(APPEND tests_${suite_id}_${tier} "${name}")
    list(APPEND groups "${suite}|${tier}")
  endforeach()
  list(REMOVE_DUPLICATES groups)
  foreach(group IN LISTS groups)
    string(REPLACE "|" ";" group "${group}")
    list(GET group 0 suite)
    list(GET group 1 tier)
    string(MAKE_C_IDENTIFIER "${suite}" suite_id)
    set(members ${tests_${suite_id}_${tier}})
    list(LENGTH members count)
    list(LENGTH tests_${suite_id} suite_count)
    set(entry "${suite}.*")
    set(filter "${suite}.*")
    if(NOT count EQUAL suite_count)
      set(entry "${suite}.* (${tier})")
      list(JOIN members ":" filter)
    endif()
    list(FIND tandem_entries "${entry}" taken)
    if(NOT taken EQUAL -1)
      set(entry "${entry} (tandem_${folder}_tests)")
    endif()
    list(APPEND tandem_entries "${entry}")
    tandem_add_entry("${entry}" "${program}" "${filter}" ${tier} ${folder} ${count})
  endforeach()
  set(tandem_entries "${tandem_entries}" PARENT_SCOPE)
endfunction()

set(tandem_entries "")
while(tandem_test_programs)
  list(POP_FRONT tandem_test_programs folder program)
  tandem_register_program(${folder} "${program}")
endwhile()
