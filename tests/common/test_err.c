/* Unit test of common/: the error table and logging helpers. */
#include "lkv_log.h"
#include "lkv_test.h"

static void test_strings(void)
{
    ASSERT_TRUE(strcmp(lkv_err_name(LKV_EINVAL), "LKV_EINVAL") == 0);
    ASSERT_TRUE(strcmp(lkv_strerror(LKV_ENOSPC), "budget or space exhausted") == 0);
    ASSERT_TRUE(strcmp(lkv_strerror(12345), "unknown error") == 0);
    ASSERT_TRUE(strcmp(lkv_err_name(LKV_OK), "LKV_OK") == 0);
    ASSERT_TRUE(LKV_EINVAL < -1000);
}

static void test_levels(void)
{
    int lvl = -1;
    ASSERT_OK(lkv_log_parse_level("warn", &lvl));
    ASSERT_EQ(lvl, LKV_LOG_WARN);
    ASSERT_ERR(lkv_log_parse_level("loud", &lvl), LKV_EINVAL);
}

int main(void)
{
    LKV_RUN(test_strings);
    LKV_RUN(test_levels);
    return 0;
}
