//! Sans-IO TCP/IP stack for lavik's appliance mode (issue 5). Work in progress.
#![forbid(unsafe_code)]
