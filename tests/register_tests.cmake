# Registers every test program's tests with CTest, each labelled with its tier (tiers.cmake) and its folder. CTest
# runs this when it loads the tests; tests/CMakeLists.txt names the programs in tandem_test_programs (folder, path,
# folder, path, ...) and the folder they run in.
#
# A test of any tier but `fast` is one CTest entry, as gtest names it (`Join.UnevenRanksWithStaticGraphMatchOneProcess`),
# so that its deadline, label and output are its own. The `fast` tests run one entry per suite (`DdpParity.*`, with
# `--gtest_filter`), which leaves out that suite's tests of other tiers: one process per suite instead of one per
# test, since loading LibTorch takes longer than most fast tests do. A failing fast entry prints gtest's
# list of the tests that failed.
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

set(tandem_fast_entries "")
while(tandem_test_programs)
  list(POP_FRONT tandem_test_programs folder program)
  tandem_list_tests("${program}" "${program}.tests" names)
  if(NOT names)
    # Not built, or it failed to list its tests: an entry that fails, saying so, instead of tests that vanish.
    add_test("tandem_${folder}_tests.CannotListItsTests" "${program}" --gtest_list_tests)
    set_tests_properties("tandem_${folder}_tests.CannotListItsTests" PROPERTIES LABELS "fast;${folder}")
    continue()
  endif()
  set(suites "")
  foreach(name IN LISTS names)
    tandem_tier_of("${name}" tier)
    string(REGEX REPLACE "\\.[^.]*$" "" suite "${name}")
    if(tier STREQUAL "fast")
      list(APPEND suites "${suite}")
      continue()
    endif()
    list(APPEND others_${folder}_${suite} "${name}")
    add_test("${name}" "${program}" "--gtest_filter=${name}")
    set_tests_properties("${name}" PROPERTIES LABELS "${tier};${folder}" TIMEOUT 300
                         WORKING_DIRECTORY "${tandem_test_working_dir}"
                         SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endforeach()
  list(REMOVE_DUPLICATES suites)
  foreach(suite IN LISTS suites)
    set(filter "${suite}.*")
    if(others_${folder}_${suite})
      list(JOIN others_${folder}_${suite} ":" left_out)
      string(APPEND filter "-${left_out}")
    endif()
    set(entry "${suite}.*")
    list(FIND tandem_fast_entries "${entry}" taken)
    if(NOT taken EQUAL -1)
      set(entry "${suite}.* (tandem_${folder}_tests)")
    endif()
    list(APPEND tandem_fast_entries "${entry}")
    add_test("${entry}" "${program}" "--gtest_filter=${filter}")
    set_tests_properties("${entry}" PROPERTIES LABELS "fast;${folder}" TIMEOUT 300
                         WORKING_DIRECTORY "${tandem_test_working_dir}")
  endforeach()
endwhile()
