# The shipped programs hold no fault injection: no symbol of a test double (FaultEnv,
# FaultTransport, the hooks' loader), and tesserad and tessera-worker not even the name
# of a hook (the CLI's LocalCluster names the prefix to pick the -faults programs). The
# -faults programs hold both, which shows the check sees what it looks for.
# cmake -DBIN_DIR=build/bin -DNM=nm -P tests/faults/no_faults.cmake
function(count out)
  execute_process(${ARGN} OUTPUT_VARIABLE n OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT n MATCHES "^[0-9]+$")
    message(FATAL_ERROR "cannot count in ${BIN_DIR}: ${ARGN}")
  endif()
  set(${out} ${n} PARENT_SCOPE)
endfunction()

function(scan program symbols_out hooks_out)
  count(n COMMAND ${NM} -C ${BIN_DIR}/${program}
        COMMAND grep -cE "FaultEnv|FaultTransport|LoadFaultHooks")
  count(m COMMAND grep -ac "TESSERA_FAULT_" ${BIN_DIR}/${program})
  message(STATUS "${program}: ${n} fault symbols, ${m} lines naming a hook")
  set(${symbols_out} ${n} PARENT_SCOPE)
  set(${hooks_out} ${m} PARENT_SCOPE)
endfunction()

foreach(program tesserad tessera-worker tessera)
  scan(${program} n m)
  if(program STREQUAL "tessera")
    set(m 0)
  endif()
  if(n GREATER 0 OR m GREATER 0)
    message(FATAL_ERROR "${program} holds fault injection (${n} symbols, ${m} strings naming "
                        "TESSERA_FAULT_*; nm -C shows them): it belongs in the -faults programs")
  endif()
endforeach()
foreach(program tesserad-faults tessera-worker-faults)
  scan(${program} n m)
  if(n EQUAL 0 OR m EQUAL 0)
    message(FATAL_ERROR "${program} shows no fault injection (${n} symbols, ${m} strings): "
                        "the check would not see it in a shipped program either")
  endif()
endforeach()
